"""Exact mode: speculation changes no bit of the output, in bf16 and fp16, for any k and controller.

Without it a position's logits depend on how many tokens its pass carried (a
1-row decode step vs a (k+1)-row verify), and in bf16 near-tied tokens flip.
"""

from __future__ import annotations

import dataclasses
import itertools
import random
from dataclasses import dataclass

import pytest
import torch

from trtspec.control.config import GoodputConfig
from trtspec.control.goodput import GoodputController, GoodputModel
from trtspec.decoding import FixedDraftLength, GenerationRequest, Penalties, SamplingParams, StopCriteria
from trtspec.decoding.types import IterationOutcome
from trtspec.runtime.pair import load_pair
from trtspec.runtime.torch.loader import load_model
from trtspec.testing.tiny import EOS_PROMPTS


@dataclass
class ShuffledK:
    """A controller that changes k every iteration (0..7), from a fixed seed."""

    seed: int

    def __post_init__(self) -> None:
        self._rng = random.Random(self.seed)

    def next_k(self) -> int:
        return self._rng.randint(0, 7)

    def observe(self, outcome: IterationOutcome) -> None:
        return None


def goodput() -> GoodputController:
    config = GoodputConfig()
    return GoodputController(GoodputModel(8, config), 8, config)


POLICIES = {"k1": lambda: FixedDraftLength(1), "k3": lambda: FixedDraftLength(3), "k5": lambda: FixedDraftLength(5),
            "goodput": goodput, "shuffled": lambda: ShuffledK(0)}


def prompts(n: int, seed: int = 0) -> list[tuple[int, ...]]:
    rng = random.Random(seed)
    return [tuple(rng.randrange(3, 380) for _ in range(rng.randrange(3, 20))) for _ in range(n)]


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_tiny_pair_speculation_is_exact(tiny_target, tiny_draft, precision):
    """The whole loop in exact mode, every k and controller. The tiny pair's greedy tokens seldom flip even
    without exact mode; the bits it rests on are checked by test_exact_mode_rows_do_not_depend_on_the_pass."""
    pair = load_pair(tiny_target, tiny_draft, target_precision=precision, draft_precision=precision, exact=True)
    assert pair.target.exact and not pair.draft.exact
    dec = pair.decoder()
    drafted = 0
    for i, ids in enumerate(prompts(12)):
        req = GenerationRequest(ids, StopCriteria(24))
        ref = dec.generate(req, FixedDraftLength(0))
        for name, policy in POLICIES.items():
            out = dec.generate(req, policy())
            assert out.token_ids == ref.token_ids, (i, name)
            drafted += out.stats.drafted_tokens
    assert drafted > 0


def test_tiny_pair_sampling_same_seed_same_output(tiny_target, tiny_draft):
    pair = load_pair(tiny_target, tiny_draft, target_precision="bf16", draft_precision="bf16", exact=True)
    dec = pair.decoder()
    outputs = set()
    drafted = accepted = 0
    for ids in prompts(6, seed=1):
        for seed in (0, 1):
            sp = SamplingParams(temperature=0.9, top_p=0.95, seed=seed, exact=True)
            req = GenerationRequest(ids, StopCriteria(30), sampling=sp)
            ref = dec.generate(req, FixedDraftLength(0))
            for k in (1, 4):
                out = dec.generate(req, FixedDraftLength(k))
                assert out.token_ids == ref.token_ids, (ids, seed, k)
                drafted += out.stats.drafted_tokens
                accepted += out.stats.accepted_tokens
            outputs.add(tuple(ref.token_ids))
    assert len(outputs) == 12  # sampling does sample: different seeds and prompts, different outputs
    print(f"acceptance {accepted / drafted:.3f}")
    assert accepted / drafted > 0.6  # the draft draws with the target's uniforms (a 1%-noise copy agrees)


@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_tiny_pair_logprobs_are_exact(tiny_target, tiny_draft, temperature):
    """Each token's log-probability and its row's five best, bit for bit the target alone's, greedy or sampled,
    every k and controller."""
    pair = load_pair(tiny_target, tiny_draft, target_precision="bf16", draft_precision="bf16", exact=True)
    dec = pair.decoder()
    drafted = 0
    for ids in prompts(6, seed=4):
        sp = SamplingParams(temperature=temperature, seed=5 if temperature else None, exact=True)
        req = GenerationRequest(ids, StopCriteria(24), sp, logprobs=True, top_logprobs=5)
        ref = dec.generate(req, FixedDraftLength(0))
        assert len(ref.logprobs) == len(ref.token_ids) == len(ref.top_logprobs) and all(x <= 0 for x in ref.logprobs)
        for name, policy in POLICIES.items():
            out = dec.generate(req, policy())
            assert (out.token_ids, out.logprobs, out.top_logprobs) == (ref.token_ids, ref.logprobs, ref.top_logprobs), (ids, name)
            drafted += out.stats.drafted_tokens
    assert drafted > 0


@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_tiny_pair_with_eos_held_back_is_exact(tiny_target, tiny_draft, temperature):
    """min_tokens in exact mode: the banned rows read the logits, greedy or sampled; still the same bits."""
    pair = load_pair(tiny_target, tiny_draft, target_precision="bf16", draft_precision="bf16", exact=True)
    tok, dec = pair.target.tokenizer, pair.decoder()
    eos = tok.eos_token_ids()
    def plain(ids: tuple[int, ...], sp: SamplingParams) -> list[int]:
        request = GenerationRequest(ids, StopCriteria(30, eos_token_ids=eos), sp)
        return dec.generate(request, FixedDraftLength(0)).token_ids

    cases = [(tuple(tok.encode_prompt(text)), SamplingParams(temperature=temperature, seed=seed, exact=True))
             for text, seed in itertools.product(EOS_PROMPTS, range(40) if temperature else [None])]
    cut_short = [case for case in cases if len(plain(*case)) < 24]  # sampled: the seeds whose answer ends early
    changed = 0
    for ids, sp in cut_short[:4] + cases[:2]:
        req = GenerationRequest(ids, StopCriteria(30, eos_token_ids=eos, min_new_tokens=24), sp)
        ref = dec.generate(req, FixedDraftLength(0))
        assert len(ref.token_ids) >= 24 and not eos & set(ref.token_ids[:24])
        changed += ref.token_ids[: len(plain(ids, sp))] != plain(ids, sp)
        for name, policy in POLICIES.items():
            assert dec.generate(req, policy()).token_ids == ref.token_ids, (ids, sp.seed, name)
    assert changed  # holding EOS back changed some answers: the precondition of the test


@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_tiny_pair_under_penalties_is_exact(tiny_target, tiny_draft, temperature):
    """The penalties in exact mode: each row's counts take the drafts before it, so the same bits."""
    pair = load_pair(tiny_target, tiny_draft, target_precision="bf16", draft_precision="bf16", exact=True)
    dec = pair.decoder()
    pen = Penalties(repetition=1.3, presence=0.4, frequency=0.3)
    drafted = changed = 0
    for ids in prompts(6, seed=2):
        sp = SamplingParams(temperature=temperature, seed=3 if temperature else None, exact=True)
        req = GenerationRequest(ids, StopCriteria(30), dataclasses.replace(sp, penalties=pen))
        ref = dec.generate(req, FixedDraftLength(0))
        plain = dec.generate(GenerationRequest(ids, StopCriteria(30), sp), FixedDraftLength(0))
        changed += ref.token_ids != plain.token_ids
        for name, policy in POLICIES.items():
            out = dec.generate(req, policy())
            assert out.token_ids == ref.token_ids, (ids, name)
            drafted += out.stats.drafted_tokens
    assert drafted > 0 and changed >= 3  # the penalties changed answers: the precondition


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_rollback_with_static_windows_equals_a_fresh_prefill(tiny_target, precision):
    """Bit for bit, across a window bucket boundary (the windows differ, the rows agree)."""
    lm = load_model(tiny_target, precision, exact=True).lm
    ids = [(7 * i) % 380 + 3 for i in range(lm.max_context - 10)]
    a = lm.new_session()
    a.forward(ids[:100], 0)
    a.forward(ids[100:105], 5)
    a.truncate(101)  # one of five drafts kept
    a.forward(ids[101:200], 0)
    tail = a.forward(ids[200:], len(ids) - 200)  # crosses into the largest window
    fresh = lm.new_session().forward(ids, len(ids) - 200)
    assert torch.equal(tail, fresh)


def one_row_vs_six(lm, ids: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    """The logits of the position after ``ids`` from a 1-token pass and as row 0 of a 6-token pass."""
    a, b = lm.new_session(), lm.new_session()
    a.forward(list(ids), 0)
    b.forward(list(ids), 0)
    return a.forward([5], 1)[0], b.forward([5, 6, 7, 8, 9, 10], 6)[0]


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_exact_mode_rows_do_not_depend_on_the_pass(tiny_target, precision):
    lm = load_model(tiny_target, precision, exact=True).lm
    for ids in prompts(12, seed=2):
        one, six = one_row_vs_six(lm, ids)
        assert torch.equal(one, six)


@pytest.mark.slow
@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_without_exact_mode_rows_depend_on_the_pass(demo_pair_paths, precision):
    """What exact mode fixes (the same measurement without it), on the demo target: a row's logits
    differ between a 1-row and a 6-row pass (on the CPU through attention, which sums a row differently
    by the pass's rows). The tiny target's rows happen to agree on the CPU at its sizes."""
    lm = load_model(demo_pair_paths.target, precision, exact=False).lm
    assert any(not torch.equal(*one_row_vs_six(lm, ids)) for ids in prompts(12, seed=2))


DEMO_PROMPTS = [
    "Why is the sky blue?", "Name three primes.", "What is a CPU?", "Say hello in French.",
    "Define entropy.", "What is 7 times 8?", "Who wrote Hamlet?", "What is rust?",
    "Give a synonym for fast.", "What is the capital of Japan?", "Explain gravity.", "What is an atom?",
]


@pytest.mark.slow
@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_demo_pair_speculation_is_exact(demo_pair_paths, precision):
    """The real pair (SmolLM2-135M target in bf16/fp16, INT8 draft): 12 prompts, k 1/3/5 and goodput in turn."""
    pair = load_pair(demo_pair_paths.target, demo_pair_paths.draft, target_precision=precision, exact=True)
    tok = pair.target.tokenizer
    dec = pair.decoder()
    policies = itertools.cycle(["k1", "k3", "k5", "goodput"])
    drafted = 0
    for text, name in zip(DEMO_PROMPTS, policies):
        req = GenerationRequest(tuple(tok.encode_prompt(text, raw=True)), StopCriteria(6))
        ref = dec.generate(req, FixedDraftLength(0))
        out = dec.generate(req, POLICIES[name]())
        assert out.token_ids == ref.token_ids, (text, name)
        drafted += out.stats.drafted_tokens
    assert drafted > 0
