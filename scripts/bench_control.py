"""Benchmark the draft-length controllers on the demo pair (prints figures; not a test).

Workloads, all in one run, greedy decoding:

- ``demo``:    the demo pair on its prompts (chat template), 32 new tokens;
- ``wrong30``: the same with 30% of draft tokens replaced by wrong ones;
- ``wrong90``: the same with 90% (a useless draft);
- ``short``:   short raw prompts (a few tokens), 16 new tokens;
- ``mix``:     requests cycling through demo / short / wrong90 / wrong30.

Configurations: ``off`` (target alone), ``static5``, ``step``, ``heuristic``,
``goodput``; each speculating configuration runs through its own
:class:`~trtspec.control.SpeculationGovernor` (fresh per workload, so learning
from a cold start is included) with routing, breaker and fallback switched
off to compare the controllers alone; ``--guards`` adds ``governor``: the
default policy (goodput with every guard rail on). Each workload starts with
``--warmup`` untimed requests through every configuration, so the figures are
steady state (the tests cover cold starts). Requests are interleaved
(request i under every configuration, in rotating order, before request i+1)
so that load from other processes hits all configurations alike, and each
output is checked token for token against ``off``.

    python scripts/bench_control.py                # ~8-12 min on the shared 2-core machine
    python scripts/bench_control.py --requests 4   # a quick look

Time is measured with ``time.process_time`` by default (one torch thread), for
the figures AND for the loop's clock that goodput learns its costs from: on a
machine shared with other work, CPU seconds of this process measure what each
configuration costs, while wall time mostly measures the neighbours. Wall-clock
figures are printed too; ``--clock wall`` makes them the primary ones.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from trtspec.control import (
    Policy,
    RequestInfo,
    Speculation,
    SpeculationGovernor,
)
from trtspec.runtime.demo import prepare_demo
from trtspec.runtime.pair import load_pair
from trtspec.decoding import FixedDraftLength, GenerationRequest, SpeculativeDecoder, StopCriteria
from trtspec.testing.faults import WrongTokenDraft

DEMO_PROMPTS = [
    "Explain what a hash table is.",
    "Write a short poem about the sea.",
    "What are the main causes of climate change?",
    "Give me three tips for learning a new language.",
    "Describe how a bicycle works.",
    "What is the difference between a virus and a bacterium?",
    "Summarize the plot of Romeo and Juliet.",
    "How do I make a cup of tea?",
    "Why is the sky blue?",
    "List some healthy breakfast ideas.",
    "What is machine learning?",
    "Explain recursion to a beginner programmer.",
    "What are the planets of the solar system?",
    "Write a friendly email inviting a colleague to lunch.",
    "How does the internet work?",
    "What is photosynthesis?",
    "Give advice for a job interview.",
    "Describe the water cycle.",
    "What is the capital of France and what is it known for?",
    "How can I improve my sleep?",
]
SHORT_PROMPTS = [
    "Hello", "The cat", "Once upon a time", "Paris is", "def add(a, b):", "I think",
    "Water is", "My name is", "The best way", "Today we", "1, 2, 3,", "Dear John,",
]
CONFIGS = ["off", "static5", "step", "heuristic", "goodput"]


@dataclass
class Job:
    kind: str  # demo | wrong30 | wrong90 | short
    prompt: str
    raw: bool
    max_tokens: int
    wrong_share: float


@dataclass
class Cell:
    tokens: int = 0
    seconds: float = 0.0  # on the benchmark's clock (CPU seconds by default)
    wall_seconds: float = 0.0
    iterations: int = 0
    drafted: int = 0
    accepted: int = 0
    zero_k_iterations: int = 0
    mismatches: int = 0

    @property
    def tps(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0

    @property
    def wall_tps(self) -> float:
        return self.tokens / self.wall_seconds if self.wall_seconds else 0.0


def jobs_for(workload: str, n: int, max_tokens: int) -> list[Job]:
    def demo(i: int, share: float, kind: str) -> Job:
        return Job(kind, DEMO_PROMPTS[i % len(DEMO_PROMPTS)], False, max_tokens, share)

    def short(i: int) -> Job:
        return Job("short", SHORT_PROMPTS[i % len(SHORT_PROMPTS)], True, 16, 0.0)

    if workload == "demo":
        return [demo(i, 0.0, "demo") for i in range(n)]
    if workload == "wrong30":
        return [demo(i, 0.3, "wrong30") for i in range(n)]
    if workload == "wrong90":
        return [demo(i, 0.9, "wrong90") for i in range(n)]
    if workload == "short":
        return [short(i) for i in range(n)]
    assert workload == "mix"
    cycle: list[Callable[[int], Job]] = [
        lambda i: demo(i, 0.0, "demo"),
        short,
        lambda i: demo(i, 0.9, "wrong90"),
        lambda i: demo(i, 0.3, "wrong30"),
    ]
    return [cycle[i % 4](i) for i in range(n)]


def bench_policy(config: str) -> Policy:
    """The controller alone: routing always speculates, breaker and fallback off."""
    if config == "governor":
        return Policy()
    kind = {"static5": "static", "step": "step", "heuristic": "heuristic", "goodput": "goodput"}[config]
    return Policy.model_validate(
        {
            "routing": {"rules": [], "default_action": "speculate"},
            "draft_length": {"controller": kind, "static": {"k": 5}},
            "breaker": {"enabled": False},
            "fallback": {"enabled": False},
            "admission": {"max_speculating": 64, "soft_max_speculating": 64},
        }
    )


class KRecorder:
    """Wraps a DraftLengthPolicy to record the k of each iteration the loop ran."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.outcomes = []

    def next_k(self) -> int:
        return self.inner.next_k()

    def observe(self, outcome) -> None:
        self.outcomes.append(outcome)
        self.inner.observe(outcome)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=8, help="timed requests per workload")
    ap.add_argument("--warmup", type=int, default=2,
                    help="untimed requests per workload first, through every configuration (steady state)")
    ap.add_argument("--max-tokens", type=int, default=32, help="new tokens per demo-prompt request")
    ap.add_argument("--workloads", default="demo,wrong30,wrong90,short,mix")
    ap.add_argument("--guards", action="store_true", help="also run the default policy with all guard rails")
    ap.add_argument("--configs", default=",".join(CONFIGS), help="comma-separated subset of " + ",".join(CONFIGS))
    ap.add_argument("--threads", type=int, default=1, help="torch threads (1: CPU time is then the work done)")
    ap.add_argument("--clock", choices=["cpu", "wall"], default="cpu",
                    help="cpu: time.process_time, immune to other processes on a shared machine; wall: perf_counter")
    ap.add_argument("--trace", default="", help="print the k/accepted sequence of these configs' requests to stderr")
    ap.add_argument("--json", dest="json_out", default=None, help="also write the figures to this file")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    configs = args.configs.split(",") + (["governor"] if args.guards else [])
    assert configs[0] == "off", "the first configuration must be off (the baseline)"
    clock = time.process_time if args.clock == "cpu" else time.perf_counter
    workloads = args.workloads.split(",")

    t_start = time.perf_counter()
    paths = prepare_demo(progress=lambda m: print(f"[demo] {m}", file=sys.stderr))
    pair = load_pair(paths.target, paths.draft)
    assert pair.draft is not None
    tok = pair.target.tokenizer
    target_lm, draft_lm = pair.target.lm, pair.draft.lm
    eos = tok.eos_token_ids()

    def request_for(job: Job, rid: str) -> GenerationRequest:
        ids = tuple(tok.encode_prompt(job.prompt, raw=job.raw))
        return GenerationRequest(ids, StopCriteria(max_new_tokens=job.max_tokens, eos_token_ids=eos), request_id=rid)

    target_only = SpeculativeDecoder(target_lm, None, detokenizer=tok, clock=clock)

    # warm-up (kernels, allocator): one plain and one speculative request, not timed
    warm = request_for(Job("demo", DEMO_PROMPTS[0], False, 16, 0.0), "warm")
    target_only.generate(warm)
    for k in (1, 2, 3, 5, 8):
        SpeculativeDecoder(target_lm, draft_lm, detokenizer=tok).generate(warm, FixedDraftLength(k))

    results: dict[str, dict[str, Cell]] = {}
    for w in workloads:
        jobs = jobs_for(w, args.warmup + args.requests, args.max_tokens)
        governors = {c: SpeculationGovernor(bench_policy(c), clock=time.monotonic) for c in configs if c != "off"}
        cells = {c: Cell() for c in configs}
        for i, job in enumerate(jobs):
            timed = i >= args.warmup
            req = request_for(job, f"{w}-{i}")
            draft = WrongTokenDraft(draft_lm, job.wrong_share, seed=i) if job.wrong_share > 0 else draft_lm
            spec_decoder = SpeculativeDecoder(target_lm, draft, detokenizer=tok, clock=clock)
            order = configs[i % len(configs):] + configs[: i % len(configs)]
            outputs: dict[str, list[int]] = {}
            for c in order:
                cell = cells[c]
                if c == "off":
                    rec = KRecorder(FixedDraftLength(0))
                    t0, w0 = clock(), time.perf_counter()
                    res = target_only.generate(req, rec)
                    dt, dw = clock() - t0, time.perf_counter() - w0
                else:
                    info = RequestInfo.from_request(req, speculation=Speculation.AUTO)
                    with governors[c].decide(info) as control:
                        rec = KRecorder(control)
                        decoder = spec_decoder if control.speculate else target_only
                        t0, w0 = clock(), time.perf_counter()
                        res = decoder.generate(req, rec)
                        dt, dw = clock() - t0, time.perf_counter() - w0
                outputs[c] = res.token_ids
                if c in args.trace.split(","):
                    print(f"  {'' if timed else '(warm-up) '}", end="", file=sys.stderr)
                    seq = " ".join(f"{o.k}/{o.accepted}" for o in rec.outcomes)
                    print(f"{c} {job.kind} {len(res.token_ids) / dt:.1f} tok/s: {seq}", file=sys.stderr)
                if not timed:
                    continue
                cell.tokens += len(res.token_ids)
                cell.seconds += dt
                cell.wall_seconds += dw
                for o in rec.outcomes:
                    cell.iterations += 1
                    cell.drafted += o.k
                    cell.accepted += o.accepted
                    cell.zero_k_iterations += o.k == 0
            reference = outputs["off"]
            for c in configs:
                if outputs[c] != reference:
                    cells[c].mismatches += 1  # warm-up requests are checked too
            print(f"[{w}] request {i + 1}/{len(jobs)} ({job.kind}{'' if timed else ', warm-up'}) done, "
                  f"{time.perf_counter() - t_start:.0f}s",
                  file=sys.stderr)
        results[w] = cells

    # -- the table -----------------------------------------------------------
    print()
    print(f"Demo pair: {paths.target.name} (fp32) target, {paths.draft.name} (int8) draft; greedy; "
          f"{args.requests} timed requests per workload after {args.warmup} warm-up; "
          f"{args.max_tokens} new tokens (short: 16); {args.threads} torch thread(s); clock: {args.clock}")
    head = f"{'workload':<9}" + "".join(f"{c:>19}" for c in configs)
    unit = "tokens per CPU second" if args.clock == "cpu" else "tokens/s"
    for title, rate in ((f"{unit} (speedup over off)", lambda x: x.tps),
                        ("wall-clock tokens/s (shared machine: noisy)", lambda x: x.wall_tps)):
        print(title)
        print(head)
        print("-" * len(head))
        for w, cells in results.items():
            base = rate(cells["off"])
            row = f"{w:<9}"
            for c in configs:
                row += f"{rate(cells[c]):>11.1f} ({rate(cells[c]) / base:4.2f}x)"
            print(row)
        print()
    print("mean k per iteration / share of k=0 iterations / acceptance rate")
    print(head)
    print("-" * len(head))
    for w, cells in results.items():
        row = f"{w:<9}"
        for c in configs:
            cell = cells[c]
            mean_k = cell.drafted / cell.iterations if cell.iterations else 0.0
            zero = cell.zero_k_iterations / cell.iterations if cell.iterations else 0.0
            acc = f"{cell.accepted / cell.drafted:.2f}" if cell.drafted else "  - "
            row += f"{mean_k:>7.2f} {zero:>5.0%} {acc:>5}"
        print(row)
    mism = {w: {c: cells[c].mismatches for c in configs if cells[c].mismatches} for w, cells in results.items()}
    mism = {w: m for w, m in mism.items() if m}
    print()
    print("outputs identical to the target alone: " + ("yes, every request" if not mism else f"NO: {mism}"))

    # -- the goals -----------------------------------------------------------
    print()
    print("goals:")
    ok_all = True
    if "goodput" not in configs:
        return 0 if not mism else 1
    for w, cells in results.items():
        g = cells["goodput"].tps
        best_fixed_name = max([c for c in ("off", "static5") if c in cells], key=lambda c: cells[c].tps)
        best_fixed = cells[best_fixed_name].tps
        r_best, r_off = g / best_fixed, g / cells["off"].tps
        ok = r_best >= 0.95 and r_off >= 0.95
        ok_all &= ok
        print(f"  {w:<9} goodput / best fixed ({best_fixed_name}) = {r_best:.3f}, goodput / off = {r_off:.3f}"
              f"  {'ok' if ok else 'MISSED'}")
    if "mix" in results and "heuristic" in configs:
        cells = results["mix"]
        r = cells["goodput"].tps / cells["heuristic"].tps
        ok_all &= r > 1.0
        print(f"  mix       goodput / heuristic = {r:.3f}  {'ok' if r > 1.0 else 'MISSED'}")
    print(f"total {time.perf_counter() - t_start:.0f}s")
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(
                {w: {c: {"tokens": x.tokens, "seconds": x.seconds, "wall_seconds": x.wall_seconds, "tps": x.tps,
                         "iterations": x.iterations,
                         "drafted": x.drafted, "accepted": x.accepted, "mismatches": x.mismatches}
                     for c, x in cells.items()} for w, cells in results.items()},
                f, indent=2,
            )
    return 0 if ok_all and not mism else 1


if __name__ == "__main__":
    sys.exit(main())
