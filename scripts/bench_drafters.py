#!/usr/bin/env python
"""Drafter benchmark: speculation off, the draft model, ngram, suffix and auto, on the demo pair,
beside transformers' prompt lookup decoding and assisted generation, in ONE run.

    python scripts/bench_drafters.py                         # both workloads, 24 prompts x 64 tokens
    python scripts/bench_drafters.py --prompts 6 --max-tokens 48 --json-out results/drafters.json

Workloads: (a) ``chat``, the built-in chat prompts (answers seldom repeat the prompt);
(b) ``copy``, 24 copy/edit prompts (repeat or fix a given paragraph or function);
``long`` (not run by default): the chat prompts after ~350 tokens of notes, where reading
the prompt is a large part of a request (its goal: chat's).
For each, all greedy on the same prompts and token budget: tokens/s, speedup over our
target alone (``off``), acceptance rate, tokens drafted by each drafter, and how many
outputs are identical to the target alone's (HF rows: to HF's target alone).
``auto`` runs through the control plane (a ``SpeculationGovernor`` with the goodput
controller, one per workload, learning over the workload's requests in order).
Goals: on (b) the free drafters >= 2.0x over off; on (a) auto >= 0.97x of the better
of off and model.

Our systems run prompt by prompt (each prompt on every system before the next), so a machine
whose speed drifts during the run (seen: 10-12 tokens/s for the target alone on one machine
within minutes) weighs on all alike; the HF rows run after them. Compare within one run.
``--repeats N`` runs our systems in N fresh passes (new decoders, a new governor: nothing
learnt in one pass carries to the next) and takes each prompt's least time over them: one
prompt's time moves by up to 10% between runs of the same work on a shared machine, enough to
move a 24-prompt ratio by 2-4% from run to run.

    python scripts/bench_drafters.py --no-hf --repeats 3     # the goals, measured with less noise
    python scripts/bench_drafters.py --draft-precision int8  # the INT8 draft (default: the demo's, int4 where it runs well)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from trtspec.bench.inprocess import cpu_name, run_hf, run_loop, write_json
from trtspec.control.config import DraftLengthConfig, Policy
from trtspec.control.governor import SpeculationGovernor
from trtspec.control.types import RequestInfo
from trtspec.data import benchmark_prompts, copy_edit_prompts
from trtspec.decoding import DrafterKind, FixedDraftLength, SpecStats
from trtspec.runtime.demo import prepare_demo
from trtspec.runtime.pair import load_pair


def long_prompts() -> list[str]:
    """The chat prompts, each after ~1,500 characters of notes (the copy/edit texts): ~350 tokens to read."""
    notes = " ".join(copy_edit_prompts()) * 2
    return [f"Some notes:\n{notes[97 * i: 97 * i + 1500]}\n\nNow: {p}" for i, p in enumerate(benchmark_prompts())]


WORKLOADS = {"chat": benchmark_prompts, "copy": copy_edit_prompts, "long": long_prompts}


def run_ours(pair, prompts_ids, max_tokens, eos, k, repeats: int = 1) -> dict[str, dict]:
    """off, model, ngram, suffix (fixed k) and auto (goodput through a governor), ``repeats`` times
    over: each time a fresh pass (:func:`one_pass`), and each prompt's time on a system is the least
    of its passes (a neighbour's burst only ever adds time: on a shared 2-core machine one prompt's
    time moves by up to 10% between systems doing the same work). Outputs are every pass's; the
    counts (tokens, drafted, accepted) the first pass's."""
    passes = [one_pass(pair, prompts_ids, max_tokens, eos, k) for _ in range(repeats)]
    out = {}
    for name, first in passes[0].items():
        times = zip(*(p[name]["times"] for p in passes))  # per prompt, its time in each pass
        out[name] = {**first, "time_s": sum(min(t) for t in times),
                     "outputs": [o for p in passes for o in p[name]["outputs"]]}
        progress(f"ours: {name}", out[name])
    return out


def one_pass(pair, prompts_ids, max_tokens, eos, k) -> dict[str, dict]:
    """Every system on every prompt, prompt by prompt: each prompt runs on every system before the
    next one, so a machine that speeds up or slows down during the pass weighs on all alike. Each
    system has a fresh decoder (suffix's store of recent outputs) and auto a fresh governor,
    learning over the prompts in order."""
    gov = SpeculationGovernor(Policy(draft_length=DraftLengthConfig(controller="goodput", k_max=max(k, 1))))
    systems = {name: (drafter, lambda _r, kk=kk: FixedDraftLength(kk), lambda _p: None)
               for name, drafter, kk in (("off", DrafterKind.MODEL, 0), ("model", DrafterKind.MODEL, k),
                                         ("ngram", DrafterKind.NGRAM, k), ("suffix", DrafterKind.SUFFIX, k))}
    systems["auto"] = (DrafterKind.AUTO, lambda r: gov.decide(RequestInfo.from_request(r)), lambda p: p.finish())
    decoders = {name: pair.decoder() for name in systems}
    out = {name: {"outputs": [], "times": [], "tokens": 0, "stats": SpecStats()} for name in systems}
    for ids in prompts_ids:
        for name, (drafter, policy, finish) in systems.items():
            r = run_loop(decoders[name], [ids], max_tokens, eos, policy, drafter, finish=finish)
            acc = out[name]
            acc["outputs"] += r["outputs"]
            acc["times"].append(r["time_s"])
            acc["tokens"] += r["tokens"]
            acc["stats"].merge(r["stats"])
    return out


def progress(name: str, r: dict) -> None:
    """One system's figures as soon as it finished (stderr), so a cut-short run still tells."""
    s = r.get("stats")
    extra = f", drafted {dict(s.drafted_by)}, accepted {dict(s.accepted_by)}" if s is not None else ""
    say(f"  {name}: {r['tokens']} tokens in {r['time_s']:.1f} s = {r['tokens'] / r['time_s']:.2f} tokens/s{extra}")


def run_peers(paths, draft_precision, prompts_ids, max_tokens, eos, k) -> dict[str, dict]:
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    target_hf = AutoModelForCausalLM.from_pretrained(str(paths.target), dtype=torch.float32).eval()
    draft_hf = AutoModelForCausalLM.from_pretrained(str(paths.draft_at(draft_precision)), dtype=torch.bfloat16).eval()
    run_hf(target_hf, None, prompts_ids[:1], 8, eos)  # warm-up
    out = {}
    out["HF off"] = run_hf(target_hf, None, prompts_ids, max_tokens, eos)
    progress("HF off", out["HF off"])
    out["HF prompt lookup"] = run_hf(target_hf, None, prompts_ids, max_tokens, eos, {"prompt_lookup_num_tokens": k})
    progress("HF prompt lookup", out["HF prompt lookup"])
    out["HF assisted"] = run_hf(target_hf, draft_hf, prompts_ids, max_tokens, eos)
    progress("HF assisted", out["HF assisted"])
    return out


def rows_of(ours: dict, peers: dict, n: int) -> list[dict]:
    rows = []
    base = ours["off"]["tokens"] / ours["off"]["time_s"]
    for name, r in {**ours, **peers}.items():
        ref = (peers.get("HF off") if name.startswith("HF") else ours["off"])["outputs"]
        tps = r["tokens"] / r["time_s"]
        s = r.get("stats")
        rows.append({
            "system": name if name.startswith("HF") else f"ours: {name}",
            "tokens": r["tokens"], "time_s": round(r["time_s"], 3), "tokens_per_s": round(tps, 2),
            "speedup_vs_off": round(tps / base, 3),
            "acceptance_rate": None if s is None or s.acceptance_rate is None else round(s.acceptance_rate, 4),
            "drafted_by": None if s is None else dict(s.drafted_by),
            "accepted_by": None if s is None else dict(s.accepted_by),
            "identical": f"{sum(a == ref[i % n] for i, a in enumerate(r['outputs']))}/{len(r['outputs'])}",
        })
    return rows


def goals(workload: str, rows: list[dict]) -> dict:
    by = {r["system"]: r["speedup_vs_off"] for r in rows}
    if workload == "copy":
        best_free = max(by["ours: ngram"], by["ours: suffix"], by["ours: auto"])
        return {"goal": "best of ngram/suffix/auto >= 2.0x over off", "value": best_free, "met": best_free >= 2.0}
    bar = max(1.0, by["ours: model"])
    return {"goal": "auto >= 0.97x of max(off, model)", "value": round(by["ours: auto"] / bar, 3),
            "met": by["ours: auto"] >= 0.97 * bar}


def say(m: str) -> None:
    print(m, file=sys.stderr, flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workloads", default="chat,copy", help="comma-separated: chat, copy, long")
    ap.add_argument("--prompts", type=int, default=24, help="prompts per workload (<= 24)")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--k", type=int, default=5, help="draft length of the fixed-k rows (and k_max of auto)")
    ap.add_argument("--repeats", type=int, default=1,
                    help="fresh passes of our systems; each prompt's time is the least of its passes")
    ap.add_argument("--no-hf", action="store_true", help="skip the transformers rows")
    ap.add_argument("--draft-precision", choices=("auto", "int8", "int4"), default="auto",
                    help="the draft model: auto (the demo's: int4 where it runs well, else int8), the demo's "
                         "INT8 copy, or the target's float weights at int4 (CPU)")
    ap.add_argument("--json-out", type=Path, default=None)
    args = ap.parse_args()
    if args.repeats < 1:
        ap.error(f"--repeats must be at least 1, got {args.repeats}")
    unknown = [w for w in args.workloads.split(",") if w not in WORKLOADS]
    if unknown:
        ap.error(f"--workloads: unknown {', '.join(unknown)}; choose from {', '.join(WORKLOADS)}")

    torch.manual_seed(0)
    paths = prepare_demo(progress=say)
    args.draft_precision = paths.draft_precision(args.draft_precision)
    pair = load_pair(paths.target, paths.draft_at(args.draft_precision), draft_precision=args.draft_precision,
                     progress=say)
    tok = pair.target.tokenizer
    eos = tok.eos_token_ids()
    run_loop(pair.decoder(), [tok.encode_prompt("Hello")], 8, eos, lambda _r: FixedDraftLength(args.k))  # warm-up
    summary = {"cpu": cpu_name(), "threads": torch.get_num_threads(), "max_tokens": args.max_tokens, "k": args.k,
               "draft_precision": args.draft_precision,
               "repeats": args.repeats, "workloads": {}}
    for workload in args.workloads.split(","):
        prompts = WORKLOADS[workload]()[: args.prompts]
        ids = [tok.encode_prompt(p) for p in prompts]
        say(f"{workload}: {len(prompts)} prompts x {args.max_tokens} tokens")
        ours = run_ours(pair, ids, args.max_tokens, eos, args.k, args.repeats)
        peers = {} if args.no_hf else run_peers(paths, args.draft_precision, ids, args.max_tokens, eos, args.k)
        rows = rows_of(ours, peers, len(prompts))
        summary["workloads"][workload] = {"prompts": len(prompts), "rows": rows, "goal": goals(workload, rows)}
    write_json(args.json_out, summary)
    _print_tables(summary)
    return 0


def _print_tables(s: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    con = Console()
    for workload, w in s["workloads"].items():
        t = Table(title=f"{workload}: demo pair, {w['prompts']} prompts x {s['max_tokens']} tokens, greedy, k={s['k']}, "
                        f"least of {s['repeats']} pass(es) ({s['cpu']}, {s['threads']} threads)")
        for col in ("system", "tokens/s", "speedup", "acceptance", "drafted by", "identical"):
            t.add_column(col)
        for r in w["rows"]:
            acc = r["acceptance_rate"]
            by = ", ".join(f"{k} {v}" for k, v in (r["drafted_by"] or {}).items())
            t.add_row(r["system"], f"{r['tokens_per_s']:.1f}", f"{r['speedup_vs_off']:.2f}x",
                      f"{acc:.1%}" if acc is not None else "", by, r["identical"])
        con.print(t)
        g = w["goal"]
        con.print(f"goal: {g['goal']}: {g['value']:.2f} -> {'met' if g['met'] else 'NOT met'}")


if __name__ == "__main__":
    raise SystemExit(main())
