#!/usr/bin/env python
"""Serving benchmark (the build/serve issue): what Triton costs, and concurrency.

    python scripts/bench_serving.py                     # demo pair, ~10 min on 2 cores
    python scripts/bench_serving.py --requests 6 --concurrency 4 --rounds 1 --json-out results/serving.json

One run, the demo pair, the same prompts and policy everywhere, one tritonserver:
  1. concurrency 1, ``--rounds`` times: the loop in-process with the control plane's
     governor (as spec_decode runs it), then the same requests through Triton (gRPC
     streaming), speculation auto, then off; alternating, so that a machine whose
     speed drifts during the run weighs on both sides of each comparison alike;
  2. through Triton at each ``--concurrency`` level, speculation auto and off.
Prints tokens/s, TTFT and inter-token latency p50/p99, and the serving cost at
concurrency 1: 1 - (Triton tokens/s) / (in-process tokens/s), per round and the median.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

from trtspec.bench import ArmSplit, BenchConfig, OutputLength, builtin_prompts, run_bench
from trtspec.builder.repo import write_model_repo
from trtspec.control import RequestInfo, SpeculationGovernor, load_policy
from trtspec.control.config import Policy
from trtspec.runtime.demo import prepare_demo
from trtspec.runtime.pair import load_pair
from trtspec.serving.launcher import TritonServer
from trtspec.decoding import GenerationRequest, StopCriteria


def in_process(pair, policy: Policy, prompts: list[str], max_tokens: int, speculation: str) -> dict:
    """The loop as spec_decode runs it (governor per request), sequentially; TTFT/ITL from stream chunks."""
    governor = SpeculationGovernor(policy)
    spec_dec, target_only = pair.decoder(), load_pair_target_only(pair)
    tok = pair.target.tokenizer
    ttft, itl, tokens = [], [], 0
    t_start = time.perf_counter()
    for text in prompts:
        req = GenerationRequest(tuple(tok.encode_prompt(text)), StopCriteria(max_tokens, eos_token_ids=tok.eos_token_ids()))
        with governor.decide(RequestInfo.from_request(req, speculation=speculation)) as control:
            dec = spec_dec if control.speculate else target_only
            t0 = time.perf_counter()
            last = None
            for chunk in dec.stream(req, control):
                now = time.perf_counter()
                if chunk.token_ids:
                    if last is None:
                        ttft.append(now - t0)
                    else:
                        itl += [(now - last) / len(chunk.token_ids)] * len(chunk.token_ids)
                    last = now
                    tokens += len(chunk.token_ids)
    wall = time.perf_counter() - t_start
    return {"tokens": tokens, "wall_s": wall, "tokens_per_s": tokens / wall, "ttft_ms": _pct(ttft), "itl_ms": _pct(itl)}


def load_pair_target_only(pair):
    from trtspec.decoding import SpeculativeDecoder

    return SpeculativeDecoder(pair.target.lm, None, detokenizer=pair.target.tokenizer)


def _pct(xs: list[float]) -> dict:
    if not xs:
        return {"p50": None, "p99": None}
    xs = sorted(xs)
    return {"p50": 1000 * statistics.median(xs), "p99": 1000 * xs[min(len(xs) - 1, int(0.99 * len(xs)))]}


def served(url: str, metrics_url: str, pid: int | None, concurrency: int, requests: int, max_tokens: int, arm: str) -> dict:
    cfg = BenchConfig(
        url=url, prompts=builtin_prompts(), workload_split=ArmSplit.parse(arm), output=OutputLength.parse(str(max_tokens)),
        concurrency=concurrency, requests=requests, timeout_s=600, metrics_url=metrics_url, server_pid=pid,
        label=f"c{concurrency} {arm}", probe=False,
    )
    r = run_bench(cfg)
    a = r.summary["by_arm"][arm]
    return {"tokens": a["output_tokens"], "tokens_per_s": a["tokens_per_s"], "ttft_ms": a["ttft_ms"], "itl_ms": a["itl_ms"],
            "sent": a["sent"], "answered": a["answered"], "errors": a["errors"], "acceptance_rate": a["acceptance_rate"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=8, help="requests per in-process run and per concurrency-1 run")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--concurrency", default="4,8", help="concurrency levels beyond 1")
    ap.add_argument("--policy", type=Path, default=None, help="policy file (default: the built-in policy)")
    ap.add_argument("--rounds", type=int, default=3,
                    help="concurrency-1 comparisons, in-process and Triton alternating (median reported)")
    ap.add_argument("--threads", type=int, default=0, help="torch threads per draft/target process (0: torch's default)")
    ap.add_argument("--work", type=Path, default=Path("results/serving"))
    ap.add_argument("--json-out", type=Path, default=None)
    args = ap.parse_args()
    say = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731

    paths = prepare_demo(progress=say)
    policy = load_policy(args.policy) if args.policy else Policy()
    pair = load_pair(paths.target, paths.draft)
    prompts = [p.text for p in builtin_prompts()][: args.requests]
    rows: list[dict] = []

    say("in-process: warm-up")
    in_process(pair, policy, prompts[:1], 8, "auto")
    repo = write_model_repo(args.work / "model_repo", target_checkpoint=paths.target, draft_checkpoint=paths.draft,
                            policy_file=args.policy, max_sessions=32, max_concurrency=8,
                            num_threads=args.threads)
    with TritonServer(repo, log_file=args.work / "tritonserver.log") as server:
        ep = server.endpoints
        assert ep is not None
        say("Triton: warm-up")
        served(ep.grpc, ep.metrics_url, server.pid, 1, 2, 8, "auto")
        # Concurrency 1: in-process and Triton alternate, so a machine that speeds up or
        # slows down during the run weighs on both sides of every comparison alike.
        for rnd in range(1, args.rounds + 1):
            for arm in ("auto", "off"):
                say(f"round {rnd}: in-process, speculation {arm}")
                rows.append({"where": "in-process", "concurrency": 1, "speculation": arm, "round": rnd,
                             **in_process(pair, policy, prompts, args.max_tokens, arm)})
                say(f"round {rnd}: Triton concurrency 1, speculation {arm}, {args.requests} requests")
                rows.append({"where": "triton", "concurrency": 1, "speculation": arm, "round": rnd,
                             **served(ep.grpc, ep.metrics_url, server.pid, 1, args.requests, args.max_tokens, arm)})
        for c in [int(c) for c in args.concurrency.split(",") if c.strip()]:
            n = max(args.requests, 2 * c)
            for arm in ("auto", "off"):
                say(f"Triton: concurrency {c}, speculation {arm}, {n} requests")
                rows.append({"where": "triton", "concurrency": c, "speculation": arm, "round": 1,
                             **served(ep.grpc, ep.metrics_url, server.pid, c, n, args.max_tokens, arm)})

    def tps(where: str, c: int, arm: str, rnd: int) -> float:
        return next(r["tokens_per_s"] for r in rows
                    if (r["where"], r["concurrency"], r["speculation"], r["round"]) == (where, c, arm, rnd))

    rounds = range(1, args.rounds + 1)
    cost_by_round = {arm: [1 - tps("triton", 1, arm, r) / tps("in-process", 1, arm, r) for r in rounds]
                     for arm in ("auto", "off")}
    cost = {arm: statistics.median(v) for arm, v in cost_by_round.items()}
    summary = {"max_tokens": args.max_tokens, "requests": args.requests, "policy": str(args.policy or "built-in"),
               "threads": args.threads, "rounds": args.rounds, "rows": rows,
               "serving_cost_at_concurrency_1": cost, "serving_cost_by_round": cost_by_round}
    if args.json_out:
        args.json_out.parent.mkdir(parents=True, exist_ok=True)
        args.json_out.write_text(json.dumps(summary, indent=2))
    print(f"{'where':<11}{'conc':>5}{'round':>6} {'spec':<5}{'tok/s':>8}{'speedup':>9}{'TTFT p50':>10}{'p99':>8}"
          f"{'ITL p50':>9}{'p99':>8}  acceptance")
    for r in rows:
        base = tps(r["where"], r["concurrency"], "off", r["round"])
        acc = r.get("acceptance_rate")
        f = lambda v: f"{v:.0f}" if v is not None else "-"  # noqa: E731
        print(f"{r['where']:<11}{r['concurrency']:>5}{r['round']:>6} {r['speculation']:<5}{r['tokens_per_s']:>8.1f}"
              f"{r['tokens_per_s'] / base:>8.2f}x{f(r['ttft_ms']['p50']):>10}{f(r['ttft_ms']['p99']):>8}"
              f"{f(r['itl_ms']['p50']):>9}{f(r['itl_ms']['p99']):>8}  {'' if acc is None else f'{acc:.0%}'}")
    print("serving cost at concurrency 1 (1 - Triton / in-process tokens/s), median of "
          f"{args.rounds} round(s): "
          + ", ".join(f"speculation {a}: {c:.1%} (rounds: {', '.join(f'{x:.1%}' for x in cost_by_round[a])})"
                      for a, c in cost.items()) + "  (goal: <= 10%)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
