"""Speculative greedy output is token-for-token the target's own greedy output."""

from __future__ import annotations

import dataclasses
import functools

import pytest
import torch

from trtspec.runtime.pair import load_pair
from trtspec.testing.tiny import EOS_PROMPTS
from trtspec.decoding import (DrafterKind, FixedDraftLength, GenerationRequest, LogitBias, Penalties, SamplingParams,
                              StopCriteria)

TINY_PROMPTS = ["The quick brown fox", "Hello world! How are", "def f(x): return", "Numbers 0 1 2", "Triton Inference"]


@functools.cache
def hf_model(path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()


def hf_greedy(path, prompt_ids, n, **processors):
    """Reference from transformers' own generate (an independent code path), with its ``processors``
    (``repetition_penalty``, ``sequence_bias``, ...)."""
    out = hf_model(path).generate(
        torch.tensor([prompt_ids]), max_new_tokens=n, do_sample=False, eos_token_id=None, pad_token_id=0, **processors
    )
    return out[0, len(prompt_ids) :].tolist()


@pytest.mark.parametrize("k", [0, 3, 5])
def test_min_new_tokens_matches_transformers_min_new_tokens(tiny_pair, tiny_target, k):
    """EOS held back for the first 20 tokens: transformers' own ``min_new_tokens`` is the reference."""
    tok, dec = tiny_pair.target.tokenizer, tiny_pair.decoder()
    eos = tok.eos_token_ids()

    def ends_early(ids: list[int]) -> bool:
        plain = dec.generate(GenerationRequest(tuple(ids), StopCriteria(30, eos_token_ids=eos)), FixedDraftLength(k))
        return plain.token_ids[-1] in eos and len(plain.token_ids) < 20

    ids = next((ids for ids in map(tok.encode_prompt, EOS_PROMPTS) if ends_early(ids)), None)
    assert ids is not None  # the precondition: an answer that EOS ends early
    out = dec.generate(GenerationRequest(tuple(ids), StopCriteria(30, eos_token_ids=eos, min_new_tokens=20)),
                       FixedDraftLength(k))
    model = hf_model(tiny_target)
    ref = model.generate(torch.tensor([ids]), max_new_tokens=30, min_new_tokens=20, do_sample=False,
                         eos_token_id=sorted(eos), pad_token_id=0)[0, len(ids):].tolist()
    assert out.token_ids == ref and len(ref) >= 20 and not eos & set(ref[:20])
    if k:
        assert out.stats.drafted_tokens > 0


def _bad_words(plain: list[int]) -> tuple[dict, dict]:
    words = ((plain[3],), (plain[8], plain[9]))  # a token of the plain answer, and a pair of them
    return {"bad_words": words}, {"bad_words_ids": [list(w) for w in words]}


def _repetition_penalty(plain: list[int]) -> tuple[dict, dict]:
    return {"sampling": SamplingParams(penalties=Penalties(repetition=1.8))}, {"repetition_penalty": 1.8}


def _logit_bias(plain: list[int]) -> tuple[dict, dict]:
    bias = {plain[2]: -5.0, plain[6]: -2.5, (plain[4] + 1) % 384: 3.0}
    return ({"sampling": SamplingParams(logit_bias=LogitBias.of(bias.items()))},
            {"sequence_bias": {(t,): v for t, v in bias.items()}})


# rule -> (its GenerationRequest fields and transformers' generate arguments, from the plain answer;
# how many of TINY_PROMPTS' answers it must change: the precondition)
LOGIT_RULES = {"bad_words": (_bad_words, len(TINY_PROMPTS)),
               "repetition_penalty": (_repetition_penalty, len(TINY_PROMPTS) - 1),
               "logit_bias": (_logit_bias, len(TINY_PROMPTS) - 1)}


@pytest.mark.parametrize("k", [0, 3, 5])
@pytest.mark.parametrize("rule", list(LOGIT_RULES))
def test_logit_rules_match_transformers_processors(tiny_pair, tiny_target, k, rule):
    """Each rule against transformers' own processor of that meaning as the reference: ``bad_words_ids``
    (words the text never contains), ``repetition_penalty`` (it counts the prompt and the answer, as
    TensorRT-LLM does), ``sequence_bias`` of one-token sequences (a logit bias)."""
    make, min_changed = LOGIT_RULES[rule]
    tok, dec = tiny_pair.target.tokenizer, tiny_pair.decoder()
    changed = 0
    for text in TINY_PROMPTS:
        ids = tok.encode_prompt(text)
        plain = hf_greedy(tiny_target, ids, 24)
        ours, theirs = make(plain)
        ref = hf_greedy(tiny_target, ids, 24, **theirs)
        out = dec.generate(GenerationRequest(tuple(ids), StopCriteria(24), **ours), FixedDraftLength(k))
        assert out.token_ids == ref, text
        changed += ref != plain
    assert changed >= min_changed


@pytest.mark.parametrize("k", [0, 3, 5])
@pytest.mark.parametrize("repetition", [1.0, 1.8])
def test_logprobs_match_transformers_scores(tiny_pair, tiny_target, k, repetition):
    """Each token's log-probability and its row's three best: the log-softmax of transformers' own scores at
    that step (its ``output_scores``, after its repetition penalty) is the reference."""
    tok, dec = tiny_pair.target.tokenizer, tiny_pair.decoder()
    model = hf_model(tiny_target)
    for text in TINY_PROMPTS:
        ids = tok.encode_prompt(text)
        ref = model.generate(torch.tensor([ids]), max_new_tokens=24, do_sample=False, eos_token_id=None, pad_token_id=0,
                             repetition_penalty=repetition, output_scores=True, return_dict_in_generate=True)
        ref_ids = ref.sequences[0, len(ids):].tolist()
        rows = [torch.log_softmax(s[0].float(), -1) for s in ref.scores]
        ref_lp = [float(row[t]) for row, t in zip(rows, ref_ids)]
        r = GenerationRequest(tuple(ids), StopCriteria(24), SamplingParams(penalties=Penalties(repetition=repetition)),
                              logprobs=True, top_logprobs=3)
        out = dec.generate(r, FixedDraftLength(k))
        assert out.token_ids == ref_ids, text
        assert out.logprobs == pytest.approx(ref_lp, abs=1e-4), text
        best = [torch.topk(row, 3) for row in rows]
        assert [[i for i, _ in top] for top in out.top_logprobs] == [b.indices.tolist() for b in best], text
        assert [x for top in out.top_logprobs for _, x in top] == \
            pytest.approx([x for b in best for x in b.values.tolist()], abs=1e-4), text
        if k:
            assert out.stats.drafted_tokens > 0


@pytest.mark.parametrize("k", [0, 1, 3, 5, 8])
def test_tiny_models_match_transformers_greedy(tiny_pair, tiny_target, k):
    tok = tiny_pair.target.tokenizer
    dec = tiny_pair.decoder()
    for text in TINY_PROMPTS:
        ids = tok.encode_prompt(text)
        out = dec.generate(GenerationRequest(tuple(ids), StopCriteria(24)), FixedDraftLength(k))
        assert out.token_ids == hf_greedy(tiny_target, ids, 24), text
        if k:
            assert out.stats.drafted_tokens > 0


@pytest.mark.parametrize("drafter", list(DrafterKind))
def test_tiny_models_greedy_output_is_the_targets_with_every_drafter(tiny_pair, drafter):
    tok = tiny_pair.target.tokenizer
    dec = tiny_pair.decoder()
    drafted = 0
    for text in TINY_PROMPTS + ["one two three one two three one two"]:
        req = GenerationRequest(tuple(tok.encode_prompt(text)), StopCriteria(24), drafter=drafter)
        ref = dec.generate(req, FixedDraftLength(0))
        out = dec.generate(req, FixedDraftLength(4))
        assert out.token_ids == ref.token_ids, text
        drafted += out.stats.drafted_tokens
    assert drafted > 0


@pytest.mark.parametrize("draft_precision", ["int8", "int4"])
def test_tiny_models_greedy_output_is_the_targets_with_a_quantized_draft(tiny_target, tiny_draft, draft_precision):
    pair = load_pair(tiny_target, tiny_draft, draft_precision=draft_precision)
    assert pair.draft.precision == draft_precision
    tok, dec = pair.target.tokenizer, pair.decoder()
    for text in TINY_PROMPTS:
        req = GenerationRequest(tuple(tok.encode_prompt(text)), StopCriteria(24))
        out = dec.generate(req, FixedDraftLength(4))
        assert out.token_ids == dec.generate(req, FixedDraftLength(0)).token_ids, text
        assert out.stats.drafted_tokens > 0


def test_tiny_good_draft_is_mostly_accepted(tiny_pair):
    tok = tiny_pair.target.tokenizer
    out = tiny_pair.decoder().generate(
        GenerationRequest(tuple(tok.encode_prompt("The quick brown fox")), StopCriteria(40)), FixedDraftLength(4)
    )
    assert out.stats.acceptance_rate > 0.6


def test_bad_draft_output_identical_acceptance_near_zero(tiny_target, tiny_bad_draft):
    pair = load_pair(tiny_target, tiny_bad_draft)
    ref_pair = load_pair(tiny_target, None)
    tok = pair.target.tokenizer
    accepted = drafted = 0
    for text in TINY_PROMPTS:
        req = GenerationRequest(tuple(tok.encode_prompt(text)), StopCriteria(24))
        out = pair.decoder().generate(req, FixedDraftLength(4))
        ref = ref_pair.decoder().generate(req)
        assert out.token_ids == ref.token_ids
        accepted += out.stats.accepted_tokens
        drafted += out.stats.drafted_tokens
    assert drafted > 0 and accepted / drafted < 0.1


DEMO_PROMPTS = [
    "Explain how photosynthesis works.",
    "Write a short poem about the sea.",
    "What are three tips for learning a new language?",
    "Describe the water cycle in simple terms.",
    "Give me a recipe for pancakes.",
    "Why is the sky blue?",
]


@pytest.mark.slow
def test_demo_pair_greedy_equality(demo_pair):
    """The real pair (SmolLM2-135M fp32 target, INT8 draft), 6 prompts, k = 0 vs 5."""
    tok = demo_pair.target.tokenizer
    dec = demo_pair.decoder()
    drafted = accepted = 0
    for text in DEMO_PROMPTS:
        req = GenerationRequest(tuple(tok.encode_prompt(text)), StopCriteria(48, eos_token_ids=tok.eos_token_ids()))
        ref = dec.generate(req, FixedDraftLength(0))
        out = dec.generate(req, FixedDraftLength(5))
        assert out.token_ids == ref.token_ids, text
        drafted += out.stats.drafted_tokens
        accepted += out.stats.accepted_tokens
    assert accepted / drafted > 0.6  # the INT8 copy is a useful draft


COPY_PROMPT = (
    "Repeat this sentence exactly: The committee will meet on Tuesday at noon to review the budget "
    "and the hiring plan for the next quarter."
)


@pytest.mark.slow
@pytest.mark.parametrize("drafter", [DrafterKind.NGRAM, DrafterKind.SUFFIX, DrafterKind.AUTO])
def test_demo_pair_greedy_equality_with_the_free_drafters(demo_pair, drafter):
    """The real pair, a chat prompt and a copy prompt: each free drafter's output is the target's."""
    tok = demo_pair.target.tokenizer
    dec = demo_pair.decoder()
    accepted = 0
    for text in (DEMO_PROMPTS[0], COPY_PROMPT):
        req = GenerationRequest(tuple(tok.encode_prompt(text)), StopCriteria(32, eos_token_ids=tok.eos_token_ids()))
        ref = dec.generate(req, FixedDraftLength(0))
        out = dec.generate(dataclasses.replace(req, drafter=drafter), FixedDraftLength(5))
        assert out.token_ids == ref.token_ids, text
        accepted += out.stats.accepted_tokens
    assert accepted > 0  # the copy prompt repeats its input: lookups get accepted
