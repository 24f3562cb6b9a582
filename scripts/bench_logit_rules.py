#!/usr/bin/env python
"""What a request's logit rules cost: the demo pair on the built-in chat prompts, each request with
no rule, with ``min_tokens = max_tokens`` (EOS held back), with the penalties (``repetition_penalty``
1.1, a chat UI's usual value), asking for each token's log-probability (``return_log_probs``) and with
a logit bias (-100 on the tokens of "!", OpenAI's way of keeping a token out),
speculation on (k = 5) and off (k = 0), the order turning pass to pass. Rows under a rule read the
target's logits instead of its argmax alone (served: a row of vocabulary floats from the target instead
of one id); answers that would have ended early go on under ``min_tokens``.

    python scripts/bench_logit_rules.py                       # in-process, 8 prompts x 64 tokens, 2 passes
    python scripts/bench_logit_rules.py --url localhost:8001  # a running trtspec serve (gRPC), the same requests

Prints tokens, tokens/s, acceptance and the speedup of speculation for each rule; ``--json-out`` writes them.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from trtspec.bench import builtin_prompts
from trtspec.bench.inprocess import cpu_name, write_json
from trtspec.decoding.types import LogitBias, Penalties

Totals = dict[str, float]
RULES = ("none", "min_tokens", "penalties", "logprobs", "logit_bias")
PENALTIES = Penalties(repetition=1.1)
BANNED = ("!",)  # the logit_bias rule's words, each of their tokens at -100


def demo_pair_paths():
    """The demo pair's paths (prepared on first use) and the draft's precision, as ``trtspec demo`` runs it."""
    from trtspec.runtime.demo import prepare_demo
    from trtspec.runtime.torch.loader import resolve_device

    paths = prepare_demo()
    return paths, paths.draft_precision("auto", resolve_device())


def banned_bias() -> LogitBias:
    from trtspec.runtime.tokenizer import Tokenizer

    tok = Tokenizer.from_dir(demo_pair_paths()[0].target)
    return LogitBias.of((t, -100.0) for word in tok.encode_words(BANNED) for t in word)


def in_process(prompts: list[str], max_tokens: int, passes: int) -> dict[tuple[str, int], Totals]:
    from trtspec.decoding import FixedDraftLength, GenerationRequest, SamplingParams, StopCriteria
    from trtspec.runtime.pair import load_pair

    paths, precision = demo_pair_paths()
    bias = banned_bias()
    pair = load_pair(paths.target, paths.draft_at(precision), draft_precision=precision)
    tok, dec = pair.target.tokenizer, pair.decoder()

    def one(text: str, rule: str, k: int) -> tuple[int, float, int, int]:
        held = max_tokens if rule == "min_tokens" else 0
        stop = StopCriteria(max_tokens, eos_token_ids=tok.eos_token_ids(), min_new_tokens=held)
        sampling = SamplingParams(penalties=PENALTIES if rule == "penalties" else Penalties(),
                                  logit_bias=bias if rule == "logit_bias" else LogitBias())
        request = GenerationRequest(tuple(tok.encode_prompt(text)), stop, sampling, logprobs=rule == "logprobs")
        r = dec.generate(request, FixedDraftLength(k))
        return len(r.token_ids), r.stats.total_time_s, r.stats.drafted_tokens, r.stats.accepted_tokens

    return _alternate(prompts, passes, one)


def served(url: str, prompts: list[str], max_tokens: int, passes: int) -> dict[tuple[str, int], Totals]:
    from trtspec.serving.client import GenerateParams, generate_grpc

    bias = banned_bias()  # the demo pair's ids: the server must serve it

    def one(text: str, rule: str, k: int) -> tuple[int, float, int, int]:
        params = GenerateParams(max_tokens=max_tokens, min_tokens=max_tokens if rule == "min_tokens" else None,
                                penalties=PENALTIES if rule == "penalties" else Penalties(),
                                speculation="on" if k else "off", logprobs=rule == "logprobs",
                                logit_bias=bias if rule == "logit_bias" else LogitBias())
        r = generate_grpc(url, text, params)
        return r.num_output_tokens, r.total_s, r.num_draft_tokens, r.num_accepted_tokens

    one(prompts[0], "none", 5)  # warm-up
    return _alternate(prompts, passes, one)


def _alternate(prompts: list[str], passes: int, one) -> dict[tuple[str, int], Totals]:
    """Every (rule, k) on every prompt, each pass in another order (rotated): drift weighs on all alike."""
    runs = [(rule, k) for rule in RULES for k in (5, 0)]
    totals = {run: {"tokens": 0, "seconds": 0.0, "drafted": 0, "accepted": 0} for run in runs}
    for p in range(passes):
        for text in prompts:
            for run in runs[p % len(runs):] + runs[: p % len(runs)]:
                for key, value in zip(("tokens", "seconds", "drafted", "accepted"), one(text, *run)):
                    totals[run][key] += value
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
    for (rule, k), t in totals.items():
        rows[f"{rule} k{k}"] = {"tokens": t["tokens"], "tokens_per_s": round(t["tokens"] / t["seconds"], 2),
                               "acceptance": round(t["accepted"] / t["drafted"], 3) if t["drafted"] else None}
    base = rows["none k5"]["tokens_per_s"]
    for rule in RULES:
        on, off = rows[f"{rule} k5"], rows[f"{rule} k0"]
        print(f"{rule:<11} k=5: {on['tokens']} tokens, {on['tokens_per_s']:.1f} tokens/s "
              f"({on['tokens_per_s'] / base - 1:+.1%}), "
              f"acceptance {on['acceptance']}; k=0: {off['tokens_per_s']:.1f} tokens/s; "
              f"speedup {on['tokens_per_s'] / off['tokens_per_s']:.2f}x")
    write_json(args.json_out, {"where": where, "cpu": cpu_name(), "penalties": vars(PENALTIES),
                               "banned": BANNED, "runs": rows,
                               "args": vars(args)})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
