"""The draft-verify loop against in-memory bigram models."""

from __future__ import annotations

import dataclasses
import re

import pytest
import torch

from trtspec.errors import ContextOverflowError, IncompatibleModelsError, InvalidRequestError
from trtspec.decoding import (
    DrafterKind,
    DrafterOptions,
    FinishReason,
    FixedDraftLength,
    GenerationRequest,
    LogitBias,
    Penalties,
    SamplingParams,
    SpeculativeDecoder,
    StopCriteria,
)
from trtspec.decoding.drafting import propose_locally
from trtspec.decoding.wrapping import ModelWrapper, SessionWrapper
from trtspec.testing.fakes import BigramLM, CharDetokenizer, FailingLM

V = 26


def req(prompt=(0,), max_new=20, **stop_kw) -> GenerationRequest:
    return GenerationRequest(prompt_ids=tuple(prompt), stop=StopCriteria(max_new_tokens=max_new, **stop_kw))


def target_alone(target, request):
    return SpeculativeDecoder(target).generate(request, FixedDraftLength(0))


@pytest.mark.parametrize("k", [1, 2, 3, 5, 8])
def test_greedy_output_equals_target_alone_with_a_random_draft(k):
    target = BigramLM.random(V, seed=0)
    draft = BigramLM.random(V, seed=1)  # mostly disagrees
    r = req(prompt=(3, 4, 5), max_new=40)
    ref = target_alone(target, r)
    out = SpeculativeDecoder(target, draft).generate(r, FixedDraftLength(k))
    assert out.token_ids == ref.token_ids
    assert out.stats.drafted_tokens > 0


def test_perfect_draft_is_fully_accepted_and_verify_is_one_pass():
    target = BigramLM.cycle(V)
    draft = BigramLM.cycle(V)
    k = 4
    out = SpeculativeDecoder(target, draft).generate(req(max_new=21), FixedDraftLength(k))
    assert out.token_ids == [(1 + i) % V for i in range(21)]
    s = out.stats
    assert s.acceptance_rate == 1.0
    # 1 token from the prefill, then 20 at k+1 = 5 per iteration: 4 iterations,
    # each ONE target forward of k + 1 positions.
    assert s.iterations == 5
    assert [n for _, n in target.log.forwards] == [1] + [k + 1] * 4
    assert s.bonus_tokens == 4 and s.emitted_tokens == 21
    assert s.accepted_per_position == [4, 4, 4, 4]


def test_the_first_token_comes_from_the_prefill_before_any_draft():
    target, draft = BigramLM.cycle(V), BigramLM.cycle(V)
    policy = _Recorder(3)
    gen = SpeculativeDecoder(target, draft).stream(req(prompt=(0, 1, 2), max_new=10), policy)
    first = next(gen)
    assert first.token_ids == (3,)
    assert draft.log.forwards == [] and [n for _, n in target.log.forwards] == [1]
    assert [(o.k, o.emitted) for o in policy.outcomes] == [(0, 1)]  # not chosen by the policy, observed
    rest = list(gen)
    assert [t for c in rest for t in c.token_ids] == [4, 5, 6, 7, 8, 9, 10, 11, 12]
    assert all(o.k == 3 for o in policy.outcomes[1:-1])
    assert draft.log.forwards[0][0] == 4  # the draft caught up on prompt + first token at once


def test_useless_draft_still_exact_and_acceptance_near_zero():
    target = BigramLM.cycle(V, step=1)
    draft = BigramLM.cycle(V, step=2)  # always wrong
    out = SpeculativeDecoder(target, draft).generate(req(max_new=12), FixedDraftLength(3))
    assert out.token_ids == [(1 + i) % V for i in range(12)]
    assert out.stats.accepted_tokens == 0
    assert out.stats.iterations == 12  # one correction token per iteration


def test_rollback_truncates_both_caches_to_the_accepted_prefix():
    target = BigramLM.cycle(V, step=1)
    draft = BigramLM.cycle(V, step=2)
    SpeculativeDecoder(target, draft).generate(req(prompt=(0, 1), max_new=4), FixedDraftLength(3))
    # iteration 1 (prefill): target keeps the 2 prompt tokens; iteration 2: target holds
    # 2 prompt + 1 committed + 3 drafts, keeps the 3 committed tokens, and so does the draft.
    assert target.log.truncates[:2] == [2, 3]
    assert draft.log.truncates[0] == 3


def test_k_zero_is_plain_target_decoding():
    target = BigramLM.random(V, seed=5)
    draft = BigramLM.random(V, seed=6)
    a = SpeculativeDecoder(target, draft).generate(req(max_new=15), FixedDraftLength(0))
    b = target_alone(BigramLM.random(V, seed=5), req(max_new=15))
    assert a.token_ids == b.token_ids
    assert a.stats.drafted_tokens == 0 and draft.log.forwards == []


# -- stop conditions ----------------------------------------------------------------


def test_max_new_tokens_is_exact_even_when_more_were_accepted():
    target, draft = BigramLM.cycle(V), BigramLM.cycle(V)
    out = SpeculativeDecoder(target, draft).generate(req(max_new=7), FixedDraftLength(5))
    assert len(out.token_ids) == 7
    assert out.finish_reason is FinishReason.LENGTH


def test_eos_stops_and_nothing_after_it_is_emitted():
    target, draft = BigramLM.cycle(V), BigramLM.cycle(V)
    # The perfect draft gets 1..5 accepted in one iteration; EOS=3 must cut it.
    out = SpeculativeDecoder(target, draft).generate(req(max_new=20, eos_token_ids=frozenset({3})), FixedDraftLength(5))
    assert out.token_ids == [1, 2, 3]
    assert out.finish_reason is FinishReason.STOP
    assert out.stats.emitted_tokens == 3
    assert out.stats.accepted_tokens == 5  # verification accepted more than was emitted


def test_stop_token_ids():
    target, draft = BigramLM.cycle(V), BigramLM.cycle(V)
    out = SpeculativeDecoder(target, draft).generate(
        req(max_new=20, stop_token_ids=frozenset({9, 4})), FixedDraftLength(3)
    )
    assert out.token_ids == [1, 2, 3, 4]


def _greedy_without(table: torch.Tensor, prompt_last: int, banned: set[int], n: int, min_new: int) -> list[int]:
    """By hand: greedy over a bigram table, the ``banned`` tokens never chosen among the first ``min_new``."""
    out, prev = [], prompt_last
    for i in range(n):
        row = table[prev].clone()
        if i < min_new:
            row[sorted(banned)] = float("-inf")
        prev = int(row.argmax())
        out.append(prev)
        if prev in banned:
            break
    return out


@pytest.mark.parametrize("k", [0, 1, 3, 5])
def test_min_new_tokens_holds_back_eos_and_stop_ids_the_target_choosing_among_the_others(k):
    target = BigramLM.random(V, seed=5)
    greedy = target_alone(target, req(prompt=(4,), max_new=40)).token_ids
    eos, stop_id = greedy[3], greedy[6]  # the target alone would stop at the 4th token
    r = req(prompt=(4,), max_new=40, eos_token_ids=frozenset({eos}), stop_token_ids=frozenset({stop_id}),
            min_new_tokens=12)
    expected = _greedy_without(target.table, 4, {eos, stop_id}, 40, 12)
    assert len(expected) > 12 and not {eos, stop_id} & set(expected[:12])  # the hand-made answer runs past 12
    draft = BigramLM(target.table + 0.3 * torch.randn(V, V, generator=torch.Generator().manual_seed(1)))
    out = SpeculativeDecoder(target, draft).generate(r, FixedDraftLength(k))
    assert out.token_ids == expected
    assert out.finish_reason is (FinishReason.STOP if expected[-1] in (eos, stop_id) else FinishReason.LENGTH)


def _greedy_avoiding(table: torch.Tensor, prompt: tuple[int, ...], words: list[tuple[int, ...]], n: int) -> list[int]:
    """By hand: greedy over a bigram table, never ending the text with one of ``words``."""
    text = list(prompt)
    for _ in range(n):
        row = table[text[-1]].clone()
        for w in words:
            if len(w) == 1 or text[-(len(w) - 1):] == list(w[:-1]):
                row[w[-1]] = float("-inf")
        text.append(int(row.argmax()))
    return text[len(prompt):]


@pytest.mark.parametrize("k", [0, 1, 3, 5])
def test_bad_words_never_end_the_text_the_target_choosing_among_the_others(k):
    target = BigramLM.random(V, seed=5)
    prompt = (4, 9)
    greedy = target_alone(target, req(prompt=prompt, max_new=40)).token_ids
    # a one-token word, a two-token word from the plain answer, and one whose first token ends the prompt
    words = [(greedy[2],), (greedy[5], greedy[6]), (9, greedy[0])]
    expected = _greedy_avoiding(target.table, prompt, words, 40)
    assert expected[0] != greedy[0] and greedy[2] not in expected  # the words changed the answer
    assert all(expected[i:i + 2] != [greedy[5], greedy[6]] for i in range(39))
    draft = BigramLM(target.table + 0.3 * torch.randn(V, V, generator=torch.Generator().manual_seed(1)))
    r = dataclasses.replace(req(prompt=prompt, max_new=40), bad_words=tuple(words))
    assert SpeculativeDecoder(target, draft).generate(r, FixedDraftLength(k)).token_ids == expected


def _penalised(row: torch.Tensor, text: list[int], pen: Penalties, temperature: float = 1.0) -> torch.Tensor:
    """By hand, TensorRT-LLM's order: ``row / temperature``, then each id of ``text`` divided by the
    repetition penalty (multiplied when negative), less the presence penalty, less frequency x count."""
    row = row / temperature
    for v in set(text):
        x = float(row[v])
        x = x * pen.repetition if x < 0 else x / pen.repetition
        row[v] = x - pen.presence - pen.frequency * text.count(v)
    return row


@pytest.mark.parametrize("k", [0, 1, 3, 5])
@pytest.mark.parametrize("pen", [Penalties(repetition=1.6), Penalties(presence=0.8, frequency=0.5),
                                 Penalties(repetition=0.7, frequency=-0.3)])
def test_penalties_count_the_prompt_and_the_text_the_drafts_before_each_row_included(k, pen):
    target = BigramLM.random(V, seed=5)
    prompt = (4, 9, 4)
    expected = _greedy_by_hand(target.table, prompt, 40, pen)
    assert expected != target_alone(target, req(prompt=prompt, max_new=40)).token_ids  # they changed the answer
    draft = BigramLM(target.table + 0.3 * torch.randn(V, V, generator=torch.Generator().manual_seed(1)))
    r = dataclasses.replace(req(prompt=prompt, max_new=40), sampling=SamplingParams(penalties=pen))
    out = SpeculativeDecoder(target, draft).generate(r, FixedDraftLength(k))
    assert out.token_ids == expected
    if k:
        assert out.stats.accepted_tokens > 0


def _greedy_by_hand(table: torch.Tensor, prompt: tuple[int, ...], n: int, pen: Penalties,
                    bias: LogitBias = LogitBias()) -> list[int]:
    """``n`` greedy tokens of a bigram ``table`` under ``bias`` (added first) and ``pen`` (:func:`_penalised`)."""
    added = torch.zeros(table.shape[1])
    added[list(bias.ids)] = torch.tensor(bias.values)
    text = list(prompt)
    for _ in range(n):
        text.append(int(_penalised(table[text[-1]] + added, text, pen).argmax()))
    return text[len(prompt):]


@pytest.mark.parametrize("one_call", [False, True])
@pytest.mark.parametrize("sampling", [SamplingParams(penalties=Penalties(repetition=1.6, presence=0.8, frequency=0.5)),
                                      SamplingParams(logit_bias=LogitBias.of([(3, 6.0), (7, 4.0)]))],
                         ids=["penalties", "logit_bias"])
def test_the_draft_applies_the_penalties_and_the_bias_too_so_a_copy_of_the_target_is_always_right(one_call, sampling):
    """The draft's logits are biased and penalised over the text and its own drafts before, as the target's rows are."""
    target = BigramLM.random(V, seed=5)
    draft = BigramLM(target.table.clone())
    r = GenerationRequest((4, 9, 4), StopCriteria(40), sampling)
    out = SpeculativeDecoder(target, _OneCallDraft(draft) if one_call else draft).generate(r, FixedDraftLength(4))
    assert out.stats.acceptance_rate == 1.0 and out.stats.drafted_tokens >= 30
    assert out.token_ids != target_alone(target, req(prompt=(4, 9, 4), max_new=40)).token_ids


BIAS = LogitBias.of([(3, 4.0), (7, -30.0), (11, 2.5)])


@pytest.mark.parametrize("k", [0, 1, 3, 5])
def test_logit_bias_is_added_before_the_penalties_the_target_choosing_with_it(k):
    """TensorRT-LLM's order (batchApplyPenalty): the bias, then the temperature, then the penalties."""
    target = BigramLM.random(V, seed=5)
    prompt, pen = (4, 9, 4), Penalties(repetition=1.6, presence=0.5)
    expected = _greedy_by_hand(target.table, prompt, 40, pen, BIAS)
    plain = dataclasses.replace(req(prompt=prompt, max_new=40), sampling=SamplingParams(penalties=pen))
    assert expected != target_alone(target, plain).token_ids and 7 not in expected  # the bias changed the answer
    draft = BigramLM(target.table + 0.3 * torch.randn(V, V, generator=torch.Generator().manual_seed(1)))
    r = dataclasses.replace(plain, sampling=SamplingParams(penalties=pen, logit_bias=BIAS))
    out = SpeculativeDecoder(target, draft).generate(r, FixedDraftLength(k))
    assert out.token_ids == expected
    if k:
        assert out.stats.accepted_tokens > 0


@pytest.mark.parametrize("exact", [False, True])
def test_sampled_output_under_a_logit_bias_follows_the_biased_target(exact):
    """The bias before the temperature: the target's distribution is softmax((logits + bias) / T)."""
    vocab = 6
    target = BigramLM.random(vocab, seed=21, sharpness=1.5)
    draft = BigramLM.random(vocab, seed=22, sharpness=1.5)
    bias = LogitBias.of([(1, 2.0), (4, -1.5)])
    table = target.table.clone()
    table[:, [1, 4]] += torch.tensor([2.0, -1.5])
    _assert_follows_the_target(SpeculativeDecoder(target, draft), table,
                               SamplingParams(temperature=0.8, exact=exact, logit_bias=bias))


def test_a_logit_bias_for_an_id_outside_the_vocabulary_is_refused():
    r = dataclasses.replace(req(), sampling=SamplingParams(logit_bias=LogitBias.of([(V, 1.0)])))
    with pytest.raises(InvalidRequestError, match=f"logit bias: token id {V} is not in the vocabulary"):
        target_alone(BigramLM.random(V, seed=1), r)
    with pytest.raises(InvalidRequestError, match="logit bias values must be finite"):
        SamplingParams(logit_bias=LogitBias((1,), (float("inf"),))).validate()


@pytest.mark.parametrize("exact", [False, True])
def test_sampled_output_under_penalties_follows_the_penalised_target(exact):
    """Three sampled tokens, the penalties after the temperature (TensorRT-LLM's order): each sequence's
    frequency over 5000 seeded requests against its probability worked out by hand."""
    vocab, pen, sampling = 4, Penalties(repetition=1.5, presence=0.6, frequency=0.4), SamplingParams(0.7, exact=exact)
    target = BigramLM.random(vocab, seed=21, sharpness=1.5)
    draft = BigramLM.random(vocab, seed=22, sharpness=1.5)
    prompt = (0, 1, 0)
    expected = torch.zeros(vocab**3)
    for i in range(vocab**3):
        seq, text, prob = (i // vocab**2, i // vocab % vocab, i % vocab), list(prompt), 1.0
        for t in seq:
            prob *= float(torch.softmax(_penalised(target.table[text[-1]].clone(), text, pen, 0.7), -1)[t])
            text.append(t)
        expected[i] = prob
    dec, n, counts, accepted = SpeculativeDecoder(target, draft), 5000, torch.zeros(vocab**3), 0
    for seed in range(n):
        r = GenerationRequest(prompt, StopCriteria(3), dataclasses.replace(sampling, seed=seed, penalties=pen))
        out = dec.generate(r, FixedDraftLength(2))
        t1, t2, t3 = out.token_ids
        counts[(t1 * vocab + t2) * vocab + t3] += 1
        accepted += out.stats.accepted_tokens
    se = torch.sqrt(expected * (1 - expected) / n)
    assert ((counts / n - expected).abs() <= 5 * se + 0.002).all(), (counts / n - expected).abs().max()
    assert accepted > n // 20
    plain = torch.softmax(target.table[0] / 0.7, -1)
    assert (expected.view(vocab, -1).sum(-1) - plain).abs().max() > 0.05  # the penalties moved the first token


LOGPROB_CASES = [SamplingParams(), SamplingParams(penalties=Penalties(repetition=1.6, presence=0.5)),
                 SamplingParams(0.8, top_k=8, top_p=0.9, seed=3), SamplingParams(0.8, top_p=0.9, seed=3, exact=True)]


@pytest.mark.parametrize("k", [0, 1, 3, 5])
@pytest.mark.parametrize("sampling", LOGPROB_CASES, ids=["greedy", "penalties", "sampled", "exact"])
def test_logprobs_are_each_tokens_log_probability_in_the_row_it_was_chosen_from(k, sampling):
    """Worked out by hand from the bigram table: greedy, the log-softmax of the (penalised) row; sampling,
    the log of the row's probability after temperature, top-k and top-p."""
    from trtspec.decoding.acceptance import warp_probs

    target = BigramLM.random(V, seed=5)
    draft = BigramLM(target.table + 0.5 * torch.randn(V, V, generator=torch.Generator().manual_seed(1)))
    prompt = (4, 9, 4)
    r = dataclasses.replace(req(prompt=prompt, max_new=30), sampling=sampling, logprobs=True, top_logprobs=10)
    gen = SpeculativeDecoder(target, draft).stream(r, FixedDraftLength(k))
    chunks = list(gen)
    out = gen.result
    expected, best, text = [], [], list(prompt)
    for t in out.token_ids:
        row = _penalised(target.table[text[-1]].clone(), text, sampling.penalties)
        logp = torch.log_softmax(row, -1) if sampling.greedy else torch.log(warp_probs(row[None], sampling)[0])
        expected.append(float(logp[t]))
        order = sorted(range(V), key=lambda i: -float(logp[i]))[:10]  # the 10 most likely; sampled: those it may draw
        best.append([(i, float(logp[i])) for i in order if logp[i] > float("-inf")])
        text.append(t)
    assert out.logprobs == pytest.approx(expected, abs=1e-5)
    assert [[i for i, _ in top] for top in out.top_logprobs] == [[i for i, _ in top] for top in best]
    assert [x for top in out.top_logprobs for _, x in top] == pytest.approx([x for top in best for _, x in top], abs=1e-5)
    assert [x for c in chunks for x in c.logprobs] == out.logprobs
    assert [x for c in chunks for x in c.top_logprobs] == out.top_logprobs
    assert all(len(c.logprobs) == len(c.token_ids) == len(c.top_logprobs) for c in chunks)
    if sampling.top_k:
        assert all(len(top) <= 8 for top in out.top_logprobs)  # nothing outside top-k could be drawn
    if k:
        assert out.stats.accepted_tokens > 0


def test_logprobs_are_none_unless_asked_and_speculation_does_not_change_them():
    target, draft = BigramLM.random(V, seed=5), BigramLM.random(V, seed=6)
    r = req(prompt=(1, 2), max_new=25)
    assert SpeculativeDecoder(target, draft).generate(r, FixedDraftLength(3)).logprobs is None
    asked = dataclasses.replace(r, logprobs=True)
    alone = target_alone(target, asked)
    spec = SpeculativeDecoder(target, draft).generate(asked, FixedDraftLength(3))
    assert spec.token_ids == alone.token_ids and spec.logprobs == alone.logprobs
    assert len(spec.logprobs) == len(spec.token_ids) and all(x <= 0 for x in spec.logprobs)
    assert spec.to_dict()["logprobs"] == spec.logprobs and spec.top_logprobs is None
    with pytest.raises(InvalidRequestError, match="top_logprobs needs logprobs"):
        target_alone(target, dataclasses.replace(r, top_logprobs=3))
    with pytest.raises(InvalidRequestError, match=r"top_logprobs must be an integer in \[0, 20\], got 21"):
        target_alone(target, dataclasses.replace(asked, top_logprobs=21))


def test_stop_string_cuts_text_and_tokens():
    target, draft = BigramLM.cycle(V), BigramLM.cycle(V)
    dec = SpeculativeDecoder(target, draft, detokenizer=CharDetokenizer())
    # tokens 1,2,3,... decode to "bcdefg..."; stop at "ef".
    out = dec.generate(req(max_new=20, stop_strings=("ef",)), FixedDraftLength(6))
    assert out.text == "bcd"
    assert out.token_ids == [1, 2, 3, 4, 5]  # up to the token completing the stop string
    assert out.finish_reason is FinishReason.STOP


def test_streaming_chunks_add_up_and_hold_back_a_partial_stop_string():
    target, draft = BigramLM.cycle(V), BigramLM.cycle(V)
    dec = SpeculativeDecoder(target, draft, detokenizer=CharDetokenizer())
    gen = dec.stream(req(max_new=12, stop_strings=("xyz", "hij")), FixedDraftLength(2))
    chunks = list(gen)
    text = "".join(c.text for c in chunks)
    assert text == gen.result.text == "bcdefg"
    # A chunk never ends inside a possible stop string: "h" alone is held back.
    assert not any(c.text.endswith("h") for c in chunks)
    assert sum(len(c.token_ids) for c in chunks) == len(gen.result.token_ids)


def test_context_window_full():
    target = BigramLM.cycle(V, max_context=10)
    draft = BigramLM.cycle(V, max_context=10)
    out = SpeculativeDecoder(target, draft).generate(req(prompt=(0, 1, 2), max_new=50), FixedDraftLength(4))
    assert len(out.token_ids) == 7  # sequence never exceeds the 10-token window
    assert out.finish_reason is FinishReason.CONTEXT
    ref = target_alone(BigramLM.cycle(V, max_context=10), req(prompt=(0, 1, 2), max_new=50))
    assert ref.token_ids == out.token_ids


def test_cancellation_stops_the_loop_and_frees_sessions():
    target, draft = BigramLM.cycle(V), BigramLM.cycle(V)
    calls = {"n": 0}

    def cancelled():
        calls["n"] += 1
        return calls["n"] > 2

    out = SpeculativeDecoder(target, draft).generate(req(max_new=100), FixedDraftLength(2), cancelled=cancelled)
    assert out.finish_reason is FinishReason.CANCELLED
    assert len(out.token_ids) == 4  # the prefill's token, then one iteration of k + 1 = 3
    assert target.log.sessions_closed == 1 and draft.log.sessions_closed == 1


def test_closing_a_stream_early_frees_sessions():
    target, draft = BigramLM.cycle(V), BigramLM.cycle(V)
    gen = SpeculativeDecoder(target, draft).stream(req(max_new=100), FixedDraftLength(2))
    next(gen)
    gen.close()
    assert target.log.sessions_closed == 1 and draft.log.sessions_closed == 1
    assert gen.finished


class _Recorder(FixedDraftLength):
    def __init__(self, k):
        super().__init__(k)
        self.outcomes = []

    def observe(self, outcome):
        self.outcomes.append(outcome)


def test_a_failing_draft_falls_back_to_the_target_without_losing_a_token():
    target = BigramLM.random(V, seed=11)
    draft = FailingLM(BigramLM.random(V, seed=11), fail_after=5)  # agrees, then dies
    r = req(prompt=(2,), max_new=30)
    policy = _Recorder(3)
    out = SpeculativeDecoder(target, draft).generate(r, policy)
    failed = [o.draft_failed for o in policy.outcomes]
    assert failed.count(True) == 1  # the policy learns of the failure, once
    assert all(o.k == 0 for o in policy.outcomes[failed.index(True) :])
    assert out.token_ids == target_alone(BigramLM.random(V, seed=11), r).token_ids
    assert out.stats.draft_errors == 1
    assert out.stats.accepted_tokens > 0  # it did speculate before dying


# -- drafters -------------------------------------------------------------------------


@pytest.mark.parametrize("drafter", list(DrafterKind))
@pytest.mark.parametrize("k", [1, 3, 6])
def test_greedy_output_equals_target_alone_with_every_drafter(drafter, k):
    target = BigramLM.random(V, seed=0)
    r = dataclasses.replace(req(prompt=(3, 4, 5, 6, 3, 4, 7, 3, 4), max_new=60), drafter=drafter)
    ref = target_alone(target, r)
    out = SpeculativeDecoder(target, BigramLM.random(V, seed=1)).generate(r, FixedDraftLength(k))
    assert out.token_ids == ref.token_ids
    assert out.stats.drafted_tokens > 0
    assert set(out.stats.drafted_by) == {"suffix" if drafter is DrafterKind.AUTO else drafter.value}


def test_a_free_drafter_needs_no_draft_model_and_copies_repeated_text():
    target = BigramLM.cycle(V)  # continues the alphabet: the prompt already holds what follows
    r = dataclasses.replace(req(prompt=tuple(range(20)) + (0, 1, 2), max_new=12), drafter=DrafterKind.NGRAM)
    out = SpeculativeDecoder(target).generate(r, FixedDraftLength(4))
    assert out.token_ids == [(3 + i) % V for i in range(12)]
    assert out.stats.acceptance_rate == 1.0 and out.stats.drafted_by == {"ngram": out.stats.drafted_tokens}
    assert out.stats.iterations < 12


def test_a_request_for_the_model_without_a_draft_model_runs_on_the_target_alone():
    out = SpeculativeDecoder(BigramLM.random(V, seed=3)).generate(req(max_new=8), FixedDraftLength(4))
    assert out.stats.drafted_tokens == 0 and len(out.token_ids) == 8


class _Alternating(_Recorder):
    """Chooses the drafters in turn; records what it was offered."""

    def __init__(self, k):
        super().__init__(k)
        self.offered = []

    def next_drafter(self, names):
        self.offered.append(tuple(names))
        return names[len(self.offered) % len(names)]


def test_a_choosing_policy_picks_the_drafter_of_each_iteration():
    target = BigramLM.cycle(V)
    r = dataclasses.replace(req(prompt=tuple(range(10)) + (0, 1), max_new=20), drafter=DrafterKind.AUTO)
    policy = _Alternating(2)
    out = SpeculativeDecoder(target, BigramLM.cycle(V)).generate(r, policy)
    assert out.token_ids == [(2 + i) % V for i in range(20)]
    assert set(policy.offered) == {("suffix", "model")}
    names = [o.drafter for o in policy.outcomes[1:]]
    assert names[:4] == ["model", "suffix", "model", "suffix"]
    assert policy.outcomes[0].drafter == ""  # the prefill: nobody drafted
    assert sum(out.stats.drafted_by.values()) == out.stats.drafted_tokens and len(out.stats.drafted_by) == 2


def test_auto_goes_on_with_the_free_drafter_when_the_draft_model_fails():
    target = BigramLM.cycle(V)
    draft = FailingLM(BigramLM.cycle(V), fail_after=2)
    r = dataclasses.replace(req(prompt=tuple(range(10)) + (0, 1), max_new=20), drafter=DrafterKind.AUTO)
    policy = _Alternating(2)
    out = SpeculativeDecoder(target, draft).generate(r, policy)
    assert out.token_ids == [(2 + i) % V for i in range(20)]
    assert out.stats.draft_errors == 1
    failed_at = [o.draft_failed for o in policy.outcomes].index(True)
    assert set(policy.offered[:failed_at]) == {("suffix", "model")}
    assert set(policy.offered[failed_at:]) == {("suffix",)}  # offered what is still open
    assert {o.drafter for o in policy.outcomes[failed_at + 1 :] if o.k} == {"suffix"}


# -- bad input ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("request_", "message"),
    [
        (GenerationRequest((), StopCriteria(5)), "prompt is empty"),
        (GenerationRequest((1,), StopCriteria(0)), "max_tokens must be > 0"),
        (GenerationRequest((1,), StopCriteria(-3)), "max_tokens must be > 0"),
        (GenerationRequest((1, 99), StopCriteria(5)), "outside [0, 26)"),
        (GenerationRequest((1,), StopCriteria(5), SamplingParams(temperature=-1)), "temperature"),
        (GenerationRequest((1,), StopCriteria(5), SamplingParams(temperature=float("nan"))), "temperature"),
        (GenerationRequest((1,), StopCriteria(5), SamplingParams(temperature=1, top_p=0)), "top_p"),
        (GenerationRequest((1,), StopCriteria(5), SamplingParams(temperature=1, top_k=-1)), "top_k"),
        (GenerationRequest((1,), StopCriteria(5, stop_strings=("",))), "stop strings"),
        (GenerationRequest((1,), StopCriteria(5, min_new_tokens=6)), "min_tokens must be >= 0 and <= max_tokens (5)"),
        (GenerationRequest((1,), StopCriteria(5, min_new_tokens=-1)), "min_tokens must be >= 0"),
        (GenerationRequest((1,), StopCriteria(5), bad_words=((3,), ())), "a bad word must hold at least one token"),
    ],
)
def test_bad_requests_are_rejected_with_a_clear_message(request_, message):
    dec = SpeculativeDecoder(BigramLM.cycle(V), BigramLM.cycle(V))
    with pytest.raises(InvalidRequestError, match=re.escape(message)):
        dec.generate(request_, FixedDraftLength(2))


def test_negative_k_is_rejected():
    with pytest.raises(InvalidRequestError, match="k must be an integer >= 0"):
        FixedDraftLength(-1)


def test_prompt_longer_than_the_context_is_rejected():
    dec = SpeculativeDecoder(BigramLM.cycle(V, max_context=4))
    with pytest.raises(ContextOverflowError, match="context window holds 4"):
        dec.generate(req(prompt=(1, 2, 3, 4)))


def test_vocabulary_mismatch_is_rejected():
    with pytest.raises(IncompatibleModelsError, match="draft vocabulary has 10 entries, target has 26"):
        SpeculativeDecoder(BigramLM.cycle(V), BigramLM.cycle(10))


def test_the_request_is_never_mutated():
    r = req(prompt=(0, 1), max_new=5)
    before = dataclasses.asdict(r)
    SpeculativeDecoder(BigramLM.cycle(V), BigramLM.cycle(V)).generate(r, FixedDraftLength(3))
    assert dataclasses.asdict(r) == before


# -- sampling through the whole loop -----------------------------------------------------


@pytest.mark.parametrize(
    "sampling",
    [
        SamplingParams(temperature=1.0),
        SamplingParams(temperature=0.7, top_k=4),
        SamplingParams(temperature=1.3, top_p=0.8),
    ],
)
def test_sampled_loop_output_follows_the_target_distribution(sampling):
    """Joint distribution of the 2nd and 3rd emitted tokens equals the target's, with the same warp.

    The first iteration is the target's prefill (k = 0); with 3 tokens the second drafts one token,
    so both rejection sampling and the bonus token are exercised."""
    vocab = 6
    target = BigramLM.random(vocab, seed=21, sharpness=1.5)
    draft = BigramLM.random(vocab, seed=22, sharpness=1.5)
    _assert_follows_the_target(SpeculativeDecoder(target, draft), target.table, sampling)


def _assert_follows_the_target(
    dec: SpeculativeDecoder,
    table: torch.Tensor,
    sampling: SamplingParams,
    prompt: tuple[int, ...] = (0,),
    drafter: DrafterKind = DrafterKind.MODEL,
    stop: StopCriteria = StopCriteria(3),
) -> None:
    """P(t2, t3) = sum_t1 p(t1 | 0) p(t2 | t1) p(t3 | t2) over 5000 seeded requests, and drafts were kept
    (``table``: the target's logits as ``stop`` leaves them, e.g. a banned token's at -inf)."""
    from trtspec.decoding.acceptance import warp_probs

    vocab = table.shape[0]
    p = warp_probs(table, sampling)  # [vocab, vocab], row = previous token
    assert prompt[-1] == 0
    expected = ((p[0] @ p)[:, None] * p).flatten()  # prompt ends in token 0
    n = 5000
    counts = torch.zeros(vocab * vocab)
    accepted = 0
    for seed in range(n):
        r = GenerationRequest(prompt, stop, dataclasses.replace(sampling, seed=seed), drafter=drafter)
        out = dec.generate(r, FixedDraftLength(2))
        _, t2, t3 = out.token_ids
        counts[t2 * vocab + t3] += 1
        accepted += out.stats.accepted_tokens
    freq = counts / n
    se = torch.sqrt(expected * (1 - expected) / n)
    assert ((freq - expected).abs() <= 5 * se + 0.002).all(), (freq - expected).abs().max()
    assert accepted > n // 20  # drafts were checked and many kept: acceptance was exercised


@pytest.mark.parametrize(
    ("drafter", "sampling"),
    [(DrafterKind.NGRAM, SamplingParams(temperature=1.0)), (DrafterKind.SUFFIX, SamplingParams(temperature=0.7, top_k=4))],
)
def test_sampled_output_with_a_free_drafter_follows_the_target_distribution(drafter, sampling):
    """As above with a drafter that picks its tokens by lookup (probability 1 on each draft):
    the prompt repeats, so after the first token the lookup finds earlier text to propose."""
    vocab = 6
    target = BigramLM.random(vocab, seed=21, sharpness=1.5)
    dec = SpeculativeDecoder(target, drafter_options=DrafterOptions(ngram_min=1, suffix_store_outputs=0))
    best = target.table.argmax(dim=-1).tolist()
    # every token, followed by the target's likeliest next two: a match whatever t1 is, often right
    prompt = tuple(t for a in range(vocab) for t in (a, best[a], best[best[a]])) + (0,)
    _assert_follows_the_target(dec, target.table, sampling, prompt, drafter)


@pytest.mark.parametrize("exact", [False, True])
def test_sampled_output_under_min_new_tokens_follows_the_target_without_the_banned_token(exact):
    """With EOS held back for all three tokens, the target's distribution with EOS's logit at -inf
    (rejection sampling, and position-keyed token matching in exact mode)."""
    vocab, eos = 6, 2
    target = BigramLM.random(vocab, seed=21, sharpness=1.5)
    draft = BigramLM.random(vocab, seed=22, sharpness=1.5)
    banned = target.table.clone()
    banned[:, eos] = float("-inf")
    stop = StopCriteria(3, eos_token_ids=frozenset({eos}), min_new_tokens=3)
    _assert_follows_the_target(SpeculativeDecoder(target, draft), banned, SamplingParams(temperature=1.0, exact=exact),
                               stop=stop)


def test_min_new_tokens_is_refused_by_a_target_that_decides_acceptance_in_its_engine():
    target = _MatchingTarget(BigramLM.random(V, seed=4))
    r = req(prompt=(2, 7), max_new=30, eos_token_ids=frozenset({5}), min_new_tokens=4)
    with pytest.raises(InvalidRequestError, match="min_tokens, bad_words, the penalties and log-probabilities need"):
        SpeculativeDecoder(target, BigramLM.random(V, seed=4)).generate(r, FixedDraftLength(3))
    plain = req(prompt=(2, 7), max_new=30)
    for r in (dataclasses.replace(plain, sampling=SamplingParams(penalties=Penalties(repetition=1.2))),
              dataclasses.replace(plain, logprobs=True)):
        with pytest.raises(InvalidRequestError, match="need the target's logits"):
            SpeculativeDecoder(target, BigramLM.random(V, seed=4)).generate(r, FixedDraftLength(3))


def test_sampling_is_deterministic_under_a_seed():
    target, draft = BigramLM.random(V, seed=1), BigramLM.random(V, seed=2)
    dec = SpeculativeDecoder(target, draft)
    r = GenerationRequest((0,), StopCriteria(30), SamplingParams(temperature=1.0, seed=42))
    a = dec.generate(r, FixedDraftLength(3)).token_ids
    b = dec.generate(r, FixedDraftLength(3)).token_ids
    c = dec.generate(dataclasses.replace(r, sampling=SamplingParams(temperature=1.0, seed=43)), FixedDraftLength(3))
    assert a == b and a != c.token_ids


class _OneCallDraft(ModelWrapper):
    """A draft whose sessions propose k tokens in one call (as the served draft does)."""

    def __init__(self, inner: BigramLM) -> None:
        super().__init__(inner)
        self.propose_calls = 0

    def new_session(self, session_id: str = ""):
        owner = self

        class Session(SessionWrapper):
            def propose(self, ids, k, sampling, seed, text=()):
                owner.propose_calls += 1
                gen = torch.Generator().manual_seed(seed) if seed is not None else None
                return propose_locally(self.inner, ids, k, sampling, gen, text)

        return Session(self.inner.new_session(session_id))


def test_a_one_call_proposer_is_used_and_stays_exact():
    target = BigramLM.random(V, seed=3)
    draft = _OneCallDraft(BigramLM.random(V, seed=3))  # agrees with the target
    r = req(prompt=(1, 2), max_new=30)
    out = SpeculativeDecoder(target, draft).generate(r, FixedDraftLength(4))
    assert out.token_ids == target_alone(BigramLM.random(V, seed=3), r).token_ids
    assert draft.propose_calls == out.stats.iterations - 1  # one draft call per iteration after the prefill
    assert out.stats.accepted_tokens > 0
    # sampled: deterministic under a seed through the proposer as well
    rs = GenerationRequest((1,), StopCriteria(20), SamplingParams(temperature=1.0, seed=5))
    a = SpeculativeDecoder(target, draft).generate(rs, FixedDraftLength(3)).token_ids
    b = SpeculativeDecoder(target, draft).generate(rs, FixedDraftLength(3)).token_ids
    assert a == b


def test_stats_merge_adds_counts_and_positions():
    target, draft = BigramLM.cycle(V), BigramLM.cycle(V, step=2)
    dec = SpeculativeDecoder(target, draft)
    a = dec.generate(req(max_new=10), FixedDraftLength(2)).stats
    b = SpeculativeDecoder(BigramLM.cycle(V), BigramLM.cycle(V)).generate(req(max_new=12), FixedDraftLength(3)).stats
    total = dataclasses.replace(a, accepted_per_position=list(a.accepted_per_position),
                                drafted_per_position=list(a.drafted_per_position))
    total.merge(b)
    assert total.drafted_tokens == a.drafted_tokens + b.drafted_tokens
    assert total.accepted_tokens == a.accepted_tokens + b.accepted_tokens
    assert total.drafted_per_position == [a.drafted_per_position[0] + b.drafted_per_position[0],
                                          a.drafted_per_position[1] + b.drafted_per_position[1],
                                          b.drafted_per_position[2]]
    assert total.accepted_per_position[2] == b.accepted_per_position[2]


class _ArgmaxSession:
    """A target session that can answer its argmax only (as the BLS target does); counts which way it was asked."""

    def __init__(self, inner, counts: dict) -> None:
        self.inner, self.counts = inner, counts

    @property
    def num_cached(self) -> int:
        return self.inner.num_cached

    def forward(self, token_ids, num_logits):
        self.counts["logits"] += 1
        return self.inner.forward(token_ids, num_logits)

    def forward_argmax(self, token_ids, num_logits):
        self.counts["argmax"] += 1
        return self.inner.forward(token_ids, num_logits).argmax(dim=-1).tolist()

    def truncate(self, length):
        self.inner.truncate(length)

    def close(self):
        self.inner.close()


class _ArgmaxLM:
    def __init__(self, inner) -> None:
        self.inner, self.counts = inner, {"logits": 0, "argmax": 0}
        self.vocab_size, self.max_context = inner.vocab_size, inner.max_context

    def new_session(self, session_id: str = ""):
        return _ArgmaxSession(self.inner.new_session(session_id), self.counts)


def test_greedy_verification_asks_a_capable_target_for_its_argmax_only_sampling_for_logits():
    target = _ArgmaxLM(BigramLM.random(V, seed=0))
    draft = BigramLM.random(V, seed=0).table  # the target's own table: a draft that agrees
    r = req(prompt=(3, 4, 5), max_new=30)
    ref = target_alone(BigramLM.random(V, seed=0), r)
    out = SpeculativeDecoder(target, BigramLM(draft)).generate(r, FixedDraftLength(3))
    assert out.token_ids == ref.token_ids and out.stats.drafted_tokens > 0
    assert target.counts == {"logits": 0, "argmax": out.stats.iterations}
    sampled = dataclasses.replace(r, sampling=SamplingParams(temperature=0.8, seed=1))
    target.counts.update(logits=0, argmax=0)
    out = SpeculativeDecoder(target, BigramLM(draft)).generate(sampled, FixedDraftLength(3))
    assert target.counts == {"logits": out.stats.iterations, "argmax": 0}  # rejection sampling needs the rows


class _MatchingTarget:
    """A target whose sessions verify drafts themselves, as a TensorRT-LLM engine built for
    external draft tokens does: it draws its own token at each of the k + 1 positions (greedy:
    argmax) and keeps drafts while they equal it. Never asked for logits."""

    def __init__(self, inner: BigramLM) -> None:
        self.inner = inner
        self.vocab_size, self.max_context = inner.vocab_size, inner.max_context
        self.verify_calls: list[tuple[int, int]] = []  # (tokens appended, drafts)

    def new_session(self, session_id: str = ""):
        owner = self

        class Session(SessionWrapper):
            def forward(self, ids, n):
                raise AssertionError("a verifying target is never asked for logits")

            def verify(self, ids, drafted, sampling, seed):
                owner.verify_calls.append((len(ids), len(drafted)))
                from trtspec.decoding.acceptance import sample, warp_probs

                gen = torch.Generator().manual_seed(seed) if seed is not None else None
                rows = self.inner.forward(list(ids) + list(drafted), len(drafted) + 1)
                n = 0
                while True:
                    row = rows[n : n + 1]
                    y = int(row.argmax()) if sampling.greedy else sample(warp_probs(row, sampling)[0], gen)
                    if n == len(drafted) or y != drafted[n]:
                        self.inner.truncate(self.inner.num_cached - len(drafted) + n)
                        return n, y
                    n += 1

        return Session(self.inner.new_session(session_id))


def test_a_verifying_target_decides_acceptance_and_greedy_output_is_exact():
    target = _MatchingTarget(BigramLM.random(V, seed=4))
    draft = BigramLM(BigramLM.random(V, seed=4).table)  # agrees with the target
    r = req(prompt=(2, 7), max_new=30)
    ref = target_alone(BigramLM.random(V, seed=4), r)
    out = SpeculativeDecoder(target, draft).generate(r, FixedDraftLength(4))
    assert out.token_ids == ref.token_ids
    assert out.stats.accepted_tokens == out.stats.drafted_tokens > 0  # a perfect draft: all kept
    assert len(target.verify_calls) == out.stats.iterations  # one call per iteration, the first with k = 0
    assert target.verify_calls[0] == (2, 0) and all(k == 4 for _, k in target.verify_calls[1:-1])
    bad = SpeculativeDecoder(target, BigramLM.random(V, seed=9)).generate(r, FixedDraftLength(3))
    assert bad.token_ids == ref.token_ids and bad.stats.accepted_tokens < bad.stats.drafted_tokens


@pytest.mark.parametrize("sampling", [SamplingParams(temperature=1.0), SamplingParams(temperature=0.7, top_k=4)])
def test_token_matching_by_a_verifying_target_follows_the_target_distribution(sampling):
    """As the rejection-sampling test above, with acceptance decided by the target (token matching)."""
    table = BigramLM.random(6, seed=21, sharpness=1.5)
    draft = BigramLM.random(6, seed=22, sharpness=1.5)
    _assert_follows_the_target(SpeculativeDecoder(_MatchingTarget(table), draft), table.table, sampling)


def test_a_proposer_that_stops_short_is_checked_for_what_it_sent():
    """A one-call draft answering fewer than k tokens (an engine that ended the sequence) is
    verified on those; nothing is lost and the output stays exact."""

    class ShortDraft(_OneCallDraft):
        def new_session(self, session_id: str = ""):
            inner = self.inner.new_session(session_id)
            owner = self

            class Session(SessionWrapper):
                def propose(self, ids, k, sampling, seed, text=()):
                    owner.propose_calls += 1
                    return propose_locally(self.inner, ids, min(k, 2), sampling, None, text)

            return Session(inner)

    target = BigramLM.random(V, seed=5)
    draft = ShortDraft(BigramLM.random(V, seed=5))
    r = req(prompt=(4,), max_new=24)
    out = SpeculativeDecoder(target, draft).generate(r, FixedDraftLength(4))
    assert out.token_ids == target_alone(BigramLM.random(V, seed=5), r).token_ids
    assert not any(out.stats.drafted_per_position[2:])  # k = 4 asked, 2 sent: 2 checked
    assert out.stats.drafted_tokens > draft.propose_calls  # mostly 2 per call (1 where the budget allowed 1)
    assert out.stats.accepted_tokens == out.stats.drafted_tokens  # the same table: every draft kept


def test_capabilities_are_read_from_the_session_class_as_isinstance_reads_them():
    from trtspec.decoding.protocols import ArgmaxForward, DraftProposer, DraftVerifier, has_capability
    from trtspec.runtime.torch.lean import LeanSession
    from trtspec.serving.guard import GuardedSession, GuardedVerifyingSession
    from trtspec.serving.triton.bls import BLSSession

    classes = [LeanSession, GuardedSession, GuardedVerifyingSession, BLSSession, SessionWrapper]
    for cls in classes:
        session = object.__new__(cls)  # the class decides, not what __init__ would set
        for capability in (ArgmaxForward, DraftProposer, DraftVerifier):
            assert has_capability(session, capability) == isinstance(session, capability), (cls, capability)
    assert has_capability(object.__new__(LeanSession), ArgmaxForward)
    assert not has_capability(object.__new__(SessionWrapper), DraftProposer)
    assert has_capability(object.__new__(GuardedVerifyingSession), DraftVerifier)
