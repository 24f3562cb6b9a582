#!/usr/bin/env python
"""What holding EOS back costs (``min_tokens``): the demo pair on the built-in chat prompts, each
request once without and once with ``min_tokens = max_tokens`` (the order alternating pass to pass),
speculation on with k = 5. Rows under ``min_tokens`` read the target's logits instead of its
argmax alone; answers that would have ended early go on to ``max_tokens``.

    python scripts/bench_min_tokens.py                       # in-process, 8 prompts x 64 tokens, 2 passes
    python scripts/bench_min_tokens.py --url localhost:8001  # a running trtspec serve (gRPC), the same requests

Prints tokens, tokens/s and acceptance for each; ``--json-out`` writes them.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from trtspec.bench import builtin_prompts
from trtspec.bench.inprocess import cpu_name, write_json

Totals = dict[str, float]


def in_process(prompts: list[str], max_tokens: int, passes: int) -> dict[int, Totals]:
    from trtspec.decoding import FixedDraftLength, GenerationRequest, StopCriteria
    from trtspec.runtime.demo import prepare_demo
    from trtspec.runtime.pair import load_pair
    from trtspec.runtime.torch.loader import resolve_device

    paths = prepare_demo()
    precision = paths.draft_precision("auto", resolve_device())
    pair = load_pair(paths.target, paths.draft_at(precision), draft_precision=precision)
    tok, dec = pair.target.tokenizer, pair.decoder()

    def one(text: str, min_tokens: int) -> tuple[int, float, int, int]:
        stop = StopCriteria(max_tokens, eos_token_ids=tok.eos_token_ids(), min_new_tokens=min_tokens)
        r = dec.generate(GenerationRequest(tuple(tok.encode_prompt(text)), stop), FixedDraftLength(5))
        return len(r.token_ids), r.stats.total_time_s, r.stats.drafted_tokens, r.stats.accepted_tokens

    return _alternate(prompts, max_tokens, passes, one)


def served(url: str, prompts: list[str], max_tokens: int, passes: int) -> dict[int, Totals]:
    from trtspec.serving.client import GenerateParams, generate_grpc

    def one(text: str, min_tokens: int) -> tuple[int, float, int, int]:
        params = GenerateParams(max_tokens=max_tokens, min_tokens=min_tokens or None, speculation="on")
        r = generate_grpc(url, text, params)
        return r.num_output_tokens, r.total_s, r.num_draft_tokens, r.num_accepted_tokens

    one(prompts[0], 0)  # warm-up
    return _alternate(prompts, max_tokens, passes, one)


def _alternate(prompts: list[str], max_tokens: int, passes: int, one) -> dict[int, Totals]:
    totals = {m: {"tokens": 0, "seconds": 0.0, "drafted": 0, "accepted": 0} for m in (0, max_tokens)}
    for p in range(passes):
        for text in prompts:
            for m in (0, max_tokens) if p % 2 == 0 else (max_tokens, 0):
                for key, value in zip(("tokens", "seconds", "drafted", "accepted"), one(text, m)):
                    totals[m][key] += value
    return totals


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", help="a running trtspec serve's gRPC endpoint (default: in-process)")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--passes", type=int, default=2)
    ap.add_argument("--json-out", type=Path, default=None)
    args = ap.parse_args()
    prompts = [p.text for p in builtin_prompts()][: args.prompts]
    if args.url:
        totals = served(args.url, prompts, args.max_tokens, args.passes)
    else:
        totals = in_process(prompts, args.max_tokens, args.passes)
    where = f"served at {args.url}" if args.url else "in-process"
    print(f"{where}, {cpu_name()}, {len(prompts)} prompts x {args.max_tokens} tokens x {args.passes} passes")
    rows = {}
    for m, t in totals.items():
        rows[m] = {"tokens": t["tokens"], "tokens_per_s": round(t["tokens"] / t["seconds"], 2),
                   "acceptance": round(t["accepted"] / t["drafted"], 3) if t["drafted"] else None}
        print(f"min_tokens {m:>4}: {t['tokens']} tokens, {rows[m]['tokens_per_s']:.1f} tokens/s, "
              f"acceptance {rows[m]['acceptance']}")
    base, held = rows[0]["tokens_per_s"], rows[args.max_tokens]["tokens_per_s"]
    print(f"holding EOS back: tokens/s {held / base - 1:+.1%}")
    write_json(args.json_out, {"where": where, "cpu": cpu_name(), "by_min_tokens": rows, "args": vars(args)})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
