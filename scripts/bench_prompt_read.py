#!/usr/bin/env python
"""What reading a prompt costs the demo pair: one pass of n tokens from an empty cache, the INT8
draft both ways (``_weight_int8pack_mm``, and dequantized into a bf16 matmul), the INT4 draft
(the target's float weights at precision int4: its kernel at every row count) and the fp32 target.

    python scripts/bench_prompt_read.py                      # 2 threads and 1, n = 4..1000
    python scripts/bench_prompt_read.py --threads 2 --rows 8,12,16 --json-out results/read.json

The runtime dequantizes from ``DEQUANT_ROWS`` rows on, and only on a CPU with bfloat16 in
hardware (``trtspec.runtime.torch.llama._int8_by_int8pack``); this script forces each way at
every n on any CPU, so it shows whether that rule holds on this one. Least of ``--reps``
passes, ms.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

from trtspec.bench.inprocess import cpu_name, write_json
from trtspec.runtime.demo import prepare_demo
from trtspec.runtime.pair import load_pair
from trtspec.runtime.torch import llama
from trtspec.runtime.torch.loader import load_model

TEXT = "The quick brown fox jumps over the lazy dog while the committee reviews the budget. "


def read_ms(lm, ids: list[int], reps: int) -> float:
    """Least time of ``reps`` passes over ``ids`` from a new session, in ms."""
    best = float("inf")
    for _ in range(reps):
        session = lm.new_session()
        t0 = time.perf_counter()
        session.forward(ids, 1)
        best = min(best, time.perf_counter() - t0)
        session.close()
    return best * 1e3


def measure(pair, int4_draft, ids: list[int], rows: list[int], reps: int) -> list[dict]:
    out = []
    for n in rows:
        row = {"rows": n}
        for name, dequant in (("draft_int8pack_ms", False), ("draft_dequantized_ms", True)):
            llama._CPU_BF16 = dequant  # with DEQUANT_ROWS 2: the layers one way or the other, the 1-row head int8
            row[name] = round(read_ms(pair.draft.lm, ids[:n], reps), 1)
        row["draft_int4_ms"] = round(read_ms(int4_draft.lm, ids[:n], reps), 1)
        row["target_ms"] = round(read_ms(pair.target.lm, ids[:n], reps), 1)
        say(f"  {n} rows: {row}")
        out.append(row)
    return out


def say(m: str) -> None:
    print(m, file=sys.stderr, flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", default="2,1", help="comma-separated torch thread counts")
    ap.add_argument("--rows", default="4,8,12,16,32,64,256,1000", help="comma-separated prompt lengths")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--json-out", type=Path, default=None)
    args = ap.parse_args()
    rows = sorted(int(r) for r in args.rows.split(","))
    if rows[0] < 2:
        ap.error(f"--rows: each at least 2 (a 1-row pass always takes the int8 kernel), got {rows[0]}")
    hardware_bf16 = llama.cpu_bf16_matmul()
    paths = prepare_demo(progress=say)
    pair = load_pair(paths.target, paths.draft, progress=say)
    int4_draft = load_model(paths.target, "int4", device="cpu")
    ids = pair.target.tokenizer.encode_prompt(TEXT * (rows[-1] // 16 + 1))
    if len(ids) < rows[-1]:
        ap.error(f"the text has {len(ids)} tokens, fewer than {rows[-1]}")
    summary = {"cpu": cpu_name(), "bf16_in_hardware": hardware_bf16, "dequant_rows": llama.DEQUANT_ROWS,
               "reps": args.reps, "runs": []}
    llama.DEQUANT_ROWS = 2
    for lm in (pair.draft.lm, int4_draft.lm, pair.target.lm):  # warm-up
        read_ms(lm, ids[: rows[0]], 2)
    for threads in (int(t) for t in args.threads.split(",")):
        torch.set_num_threads(threads)
        say(f"{threads} thread(s)")
        summary["runs"].append({"threads": threads, "rows": measure(pair, int4_draft, ids, rows, args.reps)})
    llama._CPU_BF16, llama.DEQUANT_ROWS = hardware_bf16, summary["dequant_rows"]
    write_json(args.json_out, summary)
    _print_tables(summary)
    return 0


def _print_tables(s: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    con = Console()
    for run in s["runs"]:
        t = Table(title=f"one pass of n prompt tokens, ms, least of {s['reps']} ({s['cpu']}, {run['threads']} thread(s))")
        for col in ("n", "draft int8 kernel", "draft dequantized", "draft int4", "target fp32"):
            t.add_column(col)
        for r in run["rows"]:
            t.add_row(str(r["rows"]), f"{r['draft_int8pack_ms']:.1f}", f"{r['draft_dequantized_ms']:.1f}",
                      f"{r['draft_int4_ms']:.1f}", f"{r['target_ms']:.1f}")
        con.print(t)
    way = "dequantizes" if s["bf16_in_hardware"] else "keeps the int8 kernel (no bf16 in hardware)"
    con.print(f"this CPU: the runtime {way} from {s['dequant_rows']} rows on")


if __name__ == "__main__":
    raise SystemExit(main())
