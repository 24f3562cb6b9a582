#!/usr/bin/env python
"""Bench the demo pair on a real tritonserver at several request rates: speculation auto vs off.

    python scripts/bench_rates.py                         # 1, 5, 20 req/s + a search, ~6-10 min on 2 cores
    python scripts/bench_rates.py --rates 0.5,2 --duration 20 --no-search --out results/rates

Starts one server on the demo pair (SmolLM2-135M-Instruct target, its INT8
copy as draft; prepared once into ~/.cache/trtspec), then runs ``trtspec bench``
(open loop, Poisson arrivals, A/B ``auto,off`` interleaved) at each rate and
searches for the highest rate the machine holds without errors (timeouts
count as errors). With ``--separate`` each arm runs alone at each rate
(all traffic auto, then all off): interleaved arms share the target's queue,
and under saturation the arm that makes more target calls (off: one per
token) waits more, so interleaving overstates the gain over an all-off
deployment; the separate runs measure that. Between runs it waits until the server has finished every
request it was sent (cancelled ones included). Prints the on/off table; each
run's report (results.json, PNGs, report.md/.html) lands in
``OUT/rate-<r>/`` and the table in ``OUT/summary.md``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from trtspec.bench import ArmSplit, BenchConfig, OutputLength, builtin_prompts, run_bench, write_report
from trtspec.bench.doc import Doc
from trtspec.bench.memory import total, try_scrape


def wait_idle(metrics_url: str, expected: int, timeout_s: float = 60.0) -> float:
    """Wait until the server has finished ``expected`` requests in all (trtspec_requests_total); seconds waited."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        m = try_scrape(metrics_url)
        done = total(m, "trtspec_requests_total") if m else None
        if done is not None and done >= expected:
            return time.monotonic() - t0
        time.sleep(0.5)
    print(f"warning: the server had not finished its requests after {timeout_s:.0f}s", file=sys.stderr)
    return time.monotonic() - t0


def row(rate: float, result) -> list[list]:
    out = []
    s = result.summary
    for arm, a in s["by_arm"].items():
        out.append([
            f"{rate:g}", arm, a["sent"], a["answered"], a["errors"],
            a["ttft_ms"]["p50"], a["tpot_ms"]["p50"], a["e2e_ms"]["p50"], a["e2e_ms"]["p99"],
            a["tokens_per_s"], a["goodput_rps"],
            None if a["acceptance_rate"] is None else f"{a['acceptance_rate']:.0%}",
            None if a["speculated_share"] is None else f"{a['speculated_share']:.0%}",
            s["speedup_vs_off"].get(arm),
        ])
    return out


HEADERS = ["req/s", "arm", "sent", "answered", "errors", "TTFT p50 ms", "TPOT p50 ms", "E2E p50 ms", "E2E p99 ms",
           "tokens/s", "goodput req/s", "acceptance", "speculated", "speedup vs off"]


def fmt_table(rows: list[list]) -> str:
    from trtspec.bench.doc import fmt

    cells = [[fmt(c) if not isinstance(c, float) or abs(c) >= 10 else f"{c:.2f}" for c in r] for r in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) for i, h in enumerate(HEADERS)]
    lines = ["  ".join(h.rjust(w) for h, w in zip(HEADERS, widths, strict=True))]
    lines += ["  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) for r in cells]
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rates", default="1,5,20", help="request rates to bench, comma-separated")
    ap.add_argument("--duration", type=float, default=30.0, help="seconds of arrivals per rate")
    ap.add_argument("--max-tokens", default="32", help="output length per request (N or LO-HI)")
    ap.add_argument("--timeout", type=float, default=20.0, help="seconds before a request counts as a timeout")
    ap.add_argument("--search", action=argparse.BooleanOptionalAction, default=True,
                    help="search for the highest rate without errors")
    ap.add_argument("--search-steps", type=int, default=3)
    ap.add_argument("--separate", action="store_true",
                    help="run each arm alone at each rate (auto only, then off only) instead of interleaved; no search")
    ap.add_argument("--slo-ttft-ms", type=float, default=2000.0)
    ap.add_argument("--slo-itl-ms", type=float, default=250.0)
    ap.add_argument("--budget", type=float, default=660.0, help="stop starting runs after this many seconds")
    ap.add_argument("--model-repo", type=Path, help="serve this repository instead of writing one for the demo pair")
    ap.add_argument("--out", type=Path, default=Path("bench-rates"))
    args = ap.parse_args()

    from trtspec.serving.launcher import TritonServer

    t_start = time.monotonic()
    args.out.mkdir(parents=True, exist_ok=True)
    repo = args.model_repo
    if repo is None:
        from trtspec.builder.repo import write_model_repo
        from trtspec.runtime.demo import prepare_demo

        pair = prepare_demo(progress=lambda m: print(f"[demo] {m}", file=sys.stderr))
        repo = write_model_repo(args.out / "model_repo", target_checkpoint=pair.target, draft_checkpoint=pair.draft)
    print(f"starting tritonserver on {repo}", file=sys.stderr)
    results: dict[float, object] = {}  # interleaved runs by rate
    separate: dict[float, dict[str, object]] = {}  # --separate: rate -> arm -> run
    sent_total = 0
    with TritonServer(repo, log_file=args.out / "tritonserver.log") as server:
        ep = server.endpoints
        print(f"server ready after {time.monotonic() - t_start:.0f}s (pid {server.pid})", file=sys.stderr)

        def bench(rate: float, ab: str = "auto,off"):
            nonlocal sent_total
            cfg = BenchConfig(
                url=ep.grpc, prompts=builtin_prompts(), workload_split=ArmSplit.parse(ab),
                output=OutputLength.parse(args.max_tokens), rate=rate, duration_s=args.duration,
                timeout_s=args.timeout, metrics_url=ep.metrics_url, server_pid=server.pid,
                slo_ttft_ms=args.slo_ttft_ms, slo_itl_ms=args.slo_itl_ms, label=f"rate {rate:g}",
            )
            t0 = time.monotonic()
            result = run_bench(cfg)
            files = write_report(result, args.out / (f"rate-{rate:g}" if ab == "auto,off" else f"rate-{rate:g}-{ab}"))
            sent_total += result.summary["overall"]["sent"]
            waited = wait_idle(ep.metrics_url, sent_total)
            o = result.summary["overall"]
            print(f"rate {rate:g} ({ab}): sent {o['sent']} = answered {o['answered']} + errors {o['errors']} "
                  f"{o['errors_by_category'] or ''} in {time.monotonic() - t0:.0f}s (+{waited:.0f}s until idle); "
                  f"{files['markdown']}", file=sys.stderr)
            if ab == "auto,off":
                results[rate] = result
            else:
                separate.setdefault(rate, {})[ab] = result
            return o["errors"]

        def time_left() -> float:
            return args.budget - (time.monotonic() - t_start)

        def room_for_one() -> bool:
            return time_left() > args.duration + args.timeout + 15

        for rate in (float(r) for r in args.rates.split(",")):
            for ab in ("auto", "off") if args.separate else ("auto,off",):
                if not room_for_one():
                    print(f"skipping {rate:g} req/s ({ab}): out of time budget", file=sys.stderr)
                    continue
                bench(rate, ab)
        if args.search and results and not args.separate:
            clean = sorted(r for r, res in results.items() if res.summary["overall"]["errors"] == 0)
            failing = sorted(r for r, res in results.items() if res.summary["overall"]["errors"] > 0)
            lo = clean[-1] if clean else None  # highest rate without errors so far
            hi = min((r for r in failing if lo is None or r > lo), default=None)  # lowest rate with errors above it
            for _ in range(args.search_steps):
                if not room_for_one():
                    break
                if hi is None:  # nothing failed: go higher
                    assert lo is not None
                    rate = lo * 2
                elif lo is None:  # everything failed: go lower
                    rate = hi / 3
                else:
                    rate = (lo * hi) ** 0.5  # geometric midpoint
                rate = float(f"{rate:.2g}")
                if rate in results:
                    break
                if bench(rate) == 0:
                    lo = rate
                else:
                    hi = rate
            print(f"highest rate without errors: {lo if lo is not None else 'none found'} req/s", file=sys.stderr)
    rows = [r for rate in sorted(results) for r in row(rate, results[rate])]
    for rate in sorted(separate):
        off = separate[rate].get("off")
        for arm, res in separate[rate].items():
            (r,) = row(rate, res)
            mine = res.summary["by_arm"][arm]["ms_per_token_p50"]
            theirs = off.summary["by_arm"]["off"]["ms_per_token_p50"] if off is not None else None
            r[0] = f"{rate:g} (alone)"
            r[-1] = theirs / mine if arm != "off" and mine and theirs else None
            rows.append(r)
    print(fmt_table(rows))

    def errors(res) -> int:
        return res.summary["overall"]["errors"]

    clean = {"interleaved": [r for r, res in results.items() if errors(res) == 0]}
    for arm in ("auto", "off"):
        clean[f"{arm} alone"] = [r for r, runs in separate.items() if arm in runs and errors(runs[arm]) == 0]
    best = {k: max(v) for k, v in clean.items() if v}
    verdict = ", ".join(f"{k} {v:g} req/s" for k, v in best.items()) or "none"
    print(f"highest rate without errors: {verdict}; total {time.monotonic() - t_start:.0f}s")
    doc = Doc("trtspec bench: demo pair, speculation auto vs off by request rate")
    doc.p(f"max_tokens {args.max_tokens}, {args.duration:g} s of Poisson arrivals per rate, timeout {args.timeout:g} s, "
          f"SLO TTFT {args.slo_ttft_ms:g} ms / TPOT {args.slo_itl_ms:g} ms. Highest rate without errors: {verdict}.")
    doc.table(HEADERS, rows)
    for rate in sorted(results):
        doc.p(f"{rate:g} req/s: rate-{rate:g}/report.md")
    for rate in sorted(separate):
        for arm in separate[rate]:
            doc.p(f"{rate:g} req/s, {arm} alone: rate-{rate:g}-{arm}/report.md")
    (args.out / "summary.md").write_text(doc.to_markdown())
    runs = {f"{r:g}": res for r, res in sorted(results.items())}
    runs.update({f"{r:g}-{arm}": res for r, by in sorted(separate.items()) for arm, res in by.items()})
    (args.out / "summary.json").write_text(json.dumps(
        {k: {"summary": res.summary, "client": res.client, "memory": res.memory_summary} for k, res in runs.items()},
        indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
