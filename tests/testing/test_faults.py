"""Fault-injection wrappers, driving the real loop with tiny real models."""

from __future__ import annotations

import dataclasses

import pytest

from trtspec.control import FakeClock
from trtspec.testing.faults import UnreliableDraft, WrongTokenDraft
from trtspec.errors import DraftError
from trtspec.runtime.pair import ModelPair
from trtspec.decoding import FixedDraftLength, GenerationRequest, SamplingParams, SpeculativeDecoder, StopCriteria
from trtspec.decoding.protocols import LanguageModel


def request(pair: ModelPair, text: str = "The quick brown fox", n: int = 40) -> GenerationRequest:
    ids = pair.target.tokenizer.encode_prompt(text)
    return GenerationRequest(tuple(ids), StopCriteria(max_new_tokens=n))


def decoder(pair: ModelPair, draft: LanguageModel, clock=None) -> SpeculativeDecoder:
    kw = {"clock": clock} if clock is not None else {}
    return SpeculativeDecoder(pair.target.lm, draft, detokenizer=pair.target.tokenizer, **kw)


def test_wrappers_implement_the_model_protocol(tiny_pair: ModelPair) -> None:
    assert tiny_pair.draft is not None
    for wrapped in (WrongTokenDraft(tiny_pair.draft.lm, 0.5), UnreliableDraft(tiny_pair.draft.lm)):
        assert isinstance(wrapped, LanguageModel)
        assert wrapped.vocab_size == tiny_pair.draft.lm.vocab_size


@pytest.mark.parametrize("share", [0.0, 0.3, 0.9, 1.0])
def test_wrong_tokens_lower_acceptance_as_configured(tiny_pair: ModelPair, share: float) -> None:
    assert tiny_pair.draft is not None
    req = request(tiny_pair, n=60)
    plain = decoder(tiny_pair, tiny_pair.draft.lm).generate(req)
    faulty = WrongTokenDraft(tiny_pair.draft.lm, share, seed=3)
    res = decoder(tiny_pair, faulty).generate(req, FixedDraftLength(1))
    assert res.token_ids == plain.token_ids  # verification keeps the output the target's
    assert faulty.rows > 0
    assert abs(faulty.injected / faulty.rows - share) <= 0.2
    assert res.stats.acceptance_rate is not None
    # the tiny draft agrees with the target everywhere, so with k=1 acceptance is 1 - share (sampling noise aside)
    assert abs(res.stats.acceptance_rate - (1 - share)) <= 0.2
    if share == 1.0:
        assert res.stats.accepted_tokens == 0


def test_wrong_tokens_are_deterministic_by_seed(tiny_pair: ModelPair) -> None:
    assert tiny_pair.draft is not None
    req = request(tiny_pair)
    runs = [decoder(tiny_pair, WrongTokenDraft(tiny_pair.draft.lm, 0.5, seed=11)).generate(req, FixedDraftLength(3))
            for _ in range(2)]
    assert runs[0].stats.to_dict()["accepted_per_position"] == runs[1].stats.to_dict()["accepted_per_position"]


def test_sampled_decoding_with_wrong_tokens_runs(tiny_pair: ModelPair) -> None:
    assert tiny_pair.draft is not None
    req = dataclasses.replace(request(tiny_pair, n=30), sampling=SamplingParams(temperature=1.0, seed=5))
    res = decoder(tiny_pair, WrongTokenDraft(tiny_pair.draft.lm, 0.5, seed=1)).generate(req, FixedDraftLength(4))
    assert len(res.token_ids) == 30
    assert res.stats.accepted_tokens < res.stats.drafted_tokens


def test_raising_draft_leaves_the_request_on_the_target(tiny_pair: ModelPair) -> None:
    assert tiny_pair.draft is not None
    req = request(tiny_pair)
    plain = decoder(tiny_pair, tiny_pair.draft.lm).generate(req)
    failing = UnreliableDraft(tiny_pair.draft.lm, fail_share=1.0, fail_after=4)
    gen = decoder(tiny_pair, failing).stream(req, FixedDraftLength(3))
    for _ in gen:
        pass
    res = gen.result
    assert res.token_ids == plain.token_ids
    assert res.stats.draft_errors == 1 and failing.failures == 1
    assert isinstance(gen.draft_error, DraftError)
    assert res.stats.drafted_tokens > 0  # it speculated before the failure


def test_failure_share_is_random_but_seeded() -> None:
    class Dummy:
        vocab_size = 4
        max_context = 8

        def new_session(self, session_id: str = ""):
            return self

        def forward(self, token_ids, num_logits):
            return "logits"

    wrapped = UnreliableDraft(Dummy(), fail_share=0.25, seed=1)  # type: ignore[arg-type]
    s = wrapped.new_session()
    failures = 0
    for _ in range(4000):
        try:
            s.forward([1], 1)
        except DraftError:
            failures += 1
    assert abs(failures / 4000 - 0.25) < 0.03 and wrapped.failures == failures


def test_delay_goes_through_the_injected_sleep(tiny_pair: ModelPair) -> None:
    assert tiny_pair.draft is not None
    clock = FakeClock()
    slow = UnreliableDraft(tiny_pair.draft.lm, delay_s=0.25, sleep=clock.sleep)
    outcomes = []

    class Record(FixedDraftLength):
        def observe(self, outcome) -> None:
            outcomes.append(outcome)

    decoder(tiny_pair, slow, clock=clock).generate(request(tiny_pair, n=12), Record(3))
    assert slow.calls > 0 and clock.now == pytest.approx(0.25 * slow.calls)
    for o in outcomes:
        assert o.draft_time_s == pytest.approx(0.25 * o.k)  # one forward per drafted token
        assert o.verify_time_s == 0.0  # the target is not delayed


def test_bad_arguments() -> None:
    with pytest.raises(ValueError):
        WrongTokenDraft(None, 1.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        UnreliableDraft(None, delay_s=-1)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        UnreliableDraft(None, fail_share=2)  # type: ignore[arg-type]
