#!/usr/bin/env python
"""A fresh server's first requests: what the goodput controller does before it has evidence.

    python scripts/bench_fresh_server.py                   # 10 fresh governors x the demo's 3 prompts
    python scripts/bench_fresh_server.py --servers 20 --json-out results/fresh_server.json

The demo pair in-process, and what ``trtspec demo`` sends a new server: each prompt with
speculation ``off``, then again with the default (``auto`` routing, the draft model drafting,
the goodput controller choosing ``k``), every request through one governor, as served
(``off`` requests time the target's steps for it too). Each "server" is a fresh governor on
the same loaded models. Prints, per server, each prompt's speedup of the speculating request over
its ``off`` twin with the tokens it drafted and accepted, and the reasons the controller gave
for a request that drafted nothing; then, per prompt, the speedups' median and range and how
many servers' request drafted nothing.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections import Counter
from pathlib import Path

from trtspec.bench.inprocess import cpu_name, run_loop, write_json
from trtspec.cli.demo import DEMO_PROMPTS
from trtspec.control.config import DraftLengthConfig, Policy
from trtspec.control.governor import SpeculationGovernor
from trtspec.control.types import RequestInfo
from trtspec.decoding import DrafterKind, FixedDraftLength
from trtspec.runtime.demo import prepare_demo
from trtspec.runtime.pair import load_pair


class _Reasons:
    """A request's control, recording why each iteration's ``k`` was chosen."""

    def __init__(self, control) -> None:
        self.control = control
        self.reasons: Counter[str] = Counter()

    def __getattr__(self, name: str):
        return getattr(self.control, name)

    def next_k(self, *args, **kwargs) -> int:
        k = self.control.next_k(*args, **kwargs)
        c = self.control.controller
        self.reasons[f"{self.control.last_cause}:{getattr(c, 'last_reason', '-')}"] += 1
        return k


def one_server(decoder, prompts_ids, max_tokens, eos, k_max) -> list[dict]:
    """Each prompt off, then speculating, through one fresh governor (the default policy, ``k_max``
    capped as served)."""
    gov = SpeculationGovernor(Policy(draft_length=DraftLengthConfig(k_max=k_max)))
    rows = []
    for ids in prompts_ids:
        def off_control(r):
            return gov.decide(RequestInfo.from_request(r, speculation="off"))

        off = run_loop(decoder, [ids], max_tokens, eos, off_control, finish=lambda c: c.finish())
        controls: list[_Reasons] = []

        def control(r):
            controls.append(_Reasons(gov.decide(RequestInfo.from_request(r))))
            return controls[-1]

        spec = run_loop(decoder, [ids], max_tokens, eos, control, DrafterKind.MODEL, finish=lambda c: c.finish())
        s = spec["stats"]
        rows.append({"speedup": round(off["time_s"] / spec["time_s"], 3), "drafted": sum(s.drafted_by.values()),
                     "accepted": sum(s.accepted_by.values()), "identical": spec["outputs"] == off["outputs"],
                     "reasons": dict(controls[0].reasons)})
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--servers", type=int, default=10, help="fresh governors, one after another")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--k-max", type=int, default=5,
                    help="the policy's k_max (spec_decode's draft_length caps it at 5 by default)")
    ap.add_argument("--json-out", type=Path, default=None)
    args = ap.parse_args()
    if args.servers < 1:
        ap.error(f"--servers must be at least 1, got {args.servers}")
    paths = prepare_demo(progress=say)
    pair = load_pair(paths.target, paths.draft, progress=say)
    tok = pair.target.tokenizer
    eos = tok.eos_token_ids()
    decoder = pair.decoder()
    run_loop(decoder, [tok.encode_prompt("Hello")], 8, eos, lambda _r: FixedDraftLength(5))  # warm-up
    prompts_ids = [tok.encode_prompt(p) for p in DEMO_PROMPTS]
    servers = []
    for n in range(args.servers):
        rows = one_server(decoder, prompts_ids, args.max_tokens, eos, args.k_max)
        servers.append(rows)
        print(f"server {n + 1}: " + " | ".join(f"{r['speedup']:.2f}x d{r['drafted']}/a{r['accepted']}" for r in rows),
              flush=True)
        for i, r in enumerate(rows):
            if r["drafted"] == 0:
                print(f"  prompt {i + 1} drafted nothing: {r['reasons']}", flush=True)
    summary = []
    for i, prompt in enumerate(DEMO_PROMPTS):
        x = [s[i]["speedup"] for s in servers]
        summary.append({"prompt": prompt, "speedup_median": statistics.median(x), "speedup_min": min(x),
                        "speedup_max": max(x), "drafted_nothing": sum(s[i]["drafted"] == 0 for s in servers),
                        "identical": sum(s[i]["identical"] for s in servers)})
        print(f"prompt {i + 1} ({prompt[:30]}...): speedup median {summary[-1]['speedup_median']:.2f}x "
              f"(range {min(x):.2f}-{max(x):.2f}), drafted nothing on {summary[-1]['drafted_nothing']} of "
              f"{len(servers)} servers, identical to off {summary[-1]['identical']}/{len(servers)}")
    write_json(args.json_out, {"cpu": cpu_name(), "servers": servers, "summary": summary})
    return 0


def say(m: str) -> None:
    print(m, file=sys.stderr, flush=True)


if __name__ == "__main__":
    raise SystemExit(main())
