#!/usr/bin/env python
"""Simulate the goodput controller (draft model alone) over a fresh server's first requests, with
the demo pair's measured costs and a draft whose every position is accepted with probability ``p``:
no models run, so the controller's choices are seen apart from the machine's noise.

    python scripts/sim_goodput.py                      # p = 0.95, 0.8, 0.6, 0.4, 0.1; 20 runs of 10 requests
    python scripts/sim_goodput.py --first-rejected     # each run's first draft is rejected (an unlucky start)

Prints, per ``p``: the simulated speedup over the target alone (all requests' tokens over their
seconds) and how many requests drafted under 20 tokens (stopped early). Costs (AVX-512 Xeon, demo
pair, goodput snapshot): iteration T[k] = 49/81/111/140/171/189 ms for k = 0..5, of which 27 ms per
draft token; the draft reads a prompt at 3.6 ms per token; prompts of 38 tokens, 64 new tokens.
"""

from __future__ import annotations

import argparse
import json
import random

from trtspec.control.config import GoodputConfig
from trtspec.control.goodput import GoodputController, GoodputModel
from trtspec.decoding.types import IterationOutcome

T = [0.049, 0.081, 0.111, 0.140, 0.171, 0.189]
DRAFT_S, READ_S, PROMPT, NEW, PREFILL_S = 0.027, 0.0036, 38, 64, 0.15


def one_request(model: GoodputModel, rng: random.Random, p: float, reject_first: bool) -> tuple[float, int, int]:
    """(seconds, tokens, tokens drafted) of one request after its prefill (its token and time excluded)."""
    c = GoodputController(model, len(T) - 1, model.config, max_new_tokens=NEW)
    ctx = PROMPT
    c.observe(IterationOutcome(0, 0, 1, False, ctx, 0.0, PREFILL_S))
    ctx, emitted, drafted, seconds = ctx + 1, 1, 0, 0.0
    while emitted < NEW:
        k = c.next_k()
        acc = 0
        while acc < k and rng.random() < p:
            acc += 1
        if reject_first and drafted == 0:
            acc = 0
        draft_s = 0.0 if k == 0 else (DRAFT_S * k if drafted else READ_S * ctx + DRAFT_S * (k - 1))
        verify_s = T[k] - DRAFT_S * k
        c.observe(IterationOutcome(k, acc, acc + 1, k > 0 and acc == k, ctx, draft_s, verify_s))
        seconds += draft_s + verify_s
        ctx, emitted, drafted = ctx + acc + 1, emitted + acc + 1, drafted + k
    c.finish()
    return seconds, emitted - 1, drafted


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--p", default="0.95,0.8,0.6,0.4,0.1", help="per-position acceptance, comma-separated")
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--requests", type=int, default=10, help="requests per run (a fresh server each run)")
    ap.add_argument("--first-rejected", action="store_true", help="each run's first draft is rejected")
    args = ap.parse_args()
    rows = []
    for p in (float(x) for x in args.p.split(",")):
        seconds = tokens = stopped = 0
        for seed in range(args.runs):
            model = GoodputModel(len(T) - 1, GoodputConfig(), rng=random.Random(seed))
            rng = random.Random(1000 + seed)
            for i in range(args.requests):
                s, n, d = one_request(model, rng, p, args.first_rejected and i == 0)
                seconds, tokens, stopped = seconds + s, tokens + n, stopped + (d < 20)
        rows.append({"p": p, "speedup": round(tokens / seconds * T[0], 3), "stopped_requests": stopped,
                     "requests": args.runs * args.requests})
        print(json.dumps(rows[-1]), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
