"""Helpers of the in-process benchmarks (``scripts/bench_*.py``): the demo pair in this process,
side by side with Hugging Face ``generate`` on the same prompts."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from trtspec.decoding import DraftLengthPolicy, GenerationRequest, SpecStats, SpeculativeDecoder, StopCriteria
from trtspec.decoding.types import DrafterKind


def cpu_name() -> str:
    """The CPU's model name (figures are comparable only within one CPU)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


def write_json(path: Path | None, data: dict) -> None:
    """The run's summary as JSON at ``path`` (None: not written)."""
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(data, indent=2, default=str))  # paths among the args


def run_loop(
    decoder: SpeculativeDecoder,
    prompts_ids: Sequence[Sequence[int]],
    max_tokens: int,
    eos: frozenset[int],
    policy: Callable[[GenerationRequest], DraftLengthPolicy],
    drafter: DrafterKind = DrafterKind.MODEL,
    finish: Callable[[DraftLengthPolicy], None] = lambda _p: None,
) -> dict:
    """Our loop on each prompt in turn (greedy); ``policy(request)`` gives each request its policy
    and ``finish(policy)`` is called when the request ends."""
    total = SpecStats()
    outs, elapsed = [], 0.0
    for ids in prompts_ids:
        req = GenerationRequest(tuple(ids), StopCriteria(max_tokens, eos_token_ids=eos), drafter=drafter)
        p = policy(req)
        t0 = time.perf_counter()
        r = decoder.generate(req, p)
        elapsed += time.perf_counter() - t0
        finish(p)
        outs.append(r.token_ids)
        total.merge(r.stats)
    return {"outputs": outs, "time_s": elapsed, "tokens": total.emitted_tokens, "stats": total}


def run_hf(target_hf, draft_hf, prompts_ids, max_tokens, eos, assistant_kwargs=None) -> dict:
    """transformers ``generate`` (greedy) on each prompt: the target alone, or assisted by
    ``draft_hf``; ``assistant_kwargs`` alone (``prompt_lookup_num_tokens``) is prompt lookup."""
    outs, elapsed, tokens = [], 0.0, 0
    for ids in prompts_ids:
        kwargs = dict(max_new_tokens=max_tokens, do_sample=False, eos_token_id=sorted(eos), pad_token_id=sorted(eos)[0])
        if draft_hf is not None:
            kwargs["assistant_model"] = draft_hf
        kwargs.update(assistant_kwargs or {})
        x = torch.tensor([ids])
        t0 = time.perf_counter()
        with torch.inference_mode():
            y = target_hf.generate(x, **kwargs)
        elapsed += time.perf_counter() - t0
        new = y[0, len(ids) :].tolist()
        outs.append(new)
        tokens += len(new)
    return {"outputs": outs, "time_s": elapsed, "tokens": tokens}
