"""The policies plugged into the real loop (tiny real models): whatever they decide,
greedy output is token-identical to the target alone; fallback, breaker and
goodput act on what the loop really measured."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from trtspec.control import (
    BreakerState,
    FakeClock,
    RequestControl,
    RequestInfo,
    Speculation,
    SpeculationGovernor,
    parse_policy,
)
from trtspec.runtime.pair import ModelPair, load_pair
from trtspec.decoding import GenerationRequest, SpeculativeDecoder, StopCriteria
from trtspec.decoding.protocols import LanguageModel
from trtspec.decoding.types import IterationOutcome
from trtspec.testing.faults import UnreliableDraft, WrongTokenDraft

PROMPTS = ["The quick brown fox", "Hello world! How are", "def f(x): return", "Numbers 0 1 2"]


class Recorder:
    """Passes a RequestControl through to the loop and keeps every outcome."""

    def __init__(self, control: RequestControl) -> None:
        self.control = control
        self.outcomes: list[IterationOutcome] = []

    def next_k(self) -> int:
        return self.control.next_k()

    def observe(self, outcome: IterationOutcome) -> None:
        self.outcomes.append(outcome)
        self.control.observe(outcome)


def request(pair: ModelPair, text: str, n: int = 32, rid: str = "") -> GenerationRequest:
    ids = pair.target.tokenizer.encode_prompt(text)
    return GenerationRequest(tuple(ids), StopCriteria(max_new_tokens=n), request_id=rid)


@pytest.fixture(scope="module")
def bad_pair(tiny_target, tiny_bad_draft) -> ModelPair:
    return load_pair(tiny_target, tiny_bad_draft)


@pytest.fixture(scope="module")
def reference(tiny_pair: ModelPair) -> dict[str, list[int]]:
    """Greedy output of the target alone, per prompt."""
    dec = SpeculativeDecoder(tiny_pair.target.lm, None, detokenizer=tiny_pair.target.tokenizer)
    return {p: dec.generate(request(tiny_pair, p)).token_ids for p in PROMPTS}


DRAFTS: dict[str, Callable[[ModelPair, ModelPair], LanguageModel]] = {
    "agreeing": lambda good, bad: good.draft.lm,  # type: ignore[union-attr]
    "unrelated": lambda good, bad: bad.draft.lm,  # type: ignore[union-attr]
    "wrong_50pct": lambda good, bad: WrongTokenDraft(good.draft.lm, 0.5, seed=2),  # type: ignore[union-attr]
    "failing": lambda good, bad: UnreliableDraft(good.draft.lm, fail_share=0.2, seed=4),  # type: ignore[union-attr]
}


@pytest.mark.parametrize("controller", ["static", "step", "heuristic", "goodput"])
@pytest.mark.parametrize("draft_kind", list(DRAFTS))
def test_greedy_output_is_the_targets_whatever_the_policies_decide(
    tiny_pair: ModelPair, bad_pair: ModelPair, reference: dict[str, list[int]], controller: str, draft_kind: str
) -> None:
    clock = FakeClock()
    policy = parse_policy({
        "draft_length": {"controller": controller},
        "breaker": {"min_tokens": 30, "half_open_min_tokens": 10, "cooldown_s": 1.0, "window_tokens": 200},
        "fallback": {"cooldown_tokens": 4},
    })
    gov = SpeculationGovernor(policy, clock)
    dec = SpeculativeDecoder(tiny_pair.target.lm, DRAFTS[draft_kind](tiny_pair, bad_pair),
                             detokenizer=tiny_pair.target.tokenizer)
    ks: set[int] = set()
    for round_ in range(2):
        for i, p in enumerate(PROMPTS):
            speculation = Speculation.ON if i % 2 else Speculation.AUTO  # short prompts: force some through
            with gov.decide(RequestInfo.from_request(request(tiny_pair, p), speculation=speculation)) as control:
                rec = Recorder(control)
                res = dec.generate(request(tiny_pair, p, rid=f"{round_}-{i}"), rec)
            assert res.token_ids == reference[p], (controller, draft_kind, p)
            ks |= {o.k for o in rec.outcomes}
            clock.advance(0.6)
    assert max(ks) > 0  # it did speculate at some point
    assert gov.snapshot().speculating_now == 0


def test_fallback_in_the_real_loop(tiny_pair: ModelPair) -> None:
    assert tiny_pair.draft is not None
    policy = parse_policy({"draft_length": {"controller": "static"}, "breaker": {"enabled": False},
                           "fallback": {"cooldown_tokens": 6}})
    gov = SpeculationGovernor(policy, FakeClock())
    dec = SpeculativeDecoder(tiny_pair.target.lm, WrongTokenDraft(tiny_pair.draft.lm, 1.0),
                             detokenizer=tiny_pair.target.tokenizer)
    req = request(tiny_pair, PROMPTS[0], n=40)
    with gov.decide(RequestInfo.from_request(req, speculation=Speculation.ON)) as control:
        rec = Recorder(control)
        dec.generate(req, rec)
    ks = [o.k for o in rec.outcomes]
    # the prefill's token; 3 drafts of 5, all rejected; then 6 tokens on the target alone; then it tries again
    assert ks[:11] == [0, 5, 5, 5, 0, 0, 0, 0, 0, 0, 5]
    assert all(o.accepted == 0 for o in rec.outcomes)
    assert gov.snapshot().fallbacks_total >= 2
    assert gov.rollout.status().fallback_requests == 1


def test_breaker_opens_on_a_bad_draft_and_closes_through_half_open(tiny_pair: ModelPair) -> None:
    assert tiny_pair.draft is not None
    clock = FakeClock()
    policy = parse_policy({"draft_length": {"controller": "static"}, "fallback": {"enabled": False},
                           "breaker": {"min_tokens": 40, "half_open_min_tokens": 20, "cooldown_s": 10,
                                       "half_open_fraction": 0.5}})
    transitions: list[tuple[str, str]] = []

    class Listener:
        def on_transition(self, old: BreakerState, new: BreakerState, reason: str, rate: float | None) -> None:
            transitions.append((old.value, new.value))

    gov = SpeculationGovernor(policy, clock, breaker_listeners=[Listener()])
    broken = SpeculativeDecoder(tiny_pair.target.lm, WrongTokenDraft(tiny_pair.draft.lm, 0.6, seed=9),
                                detokenizer=tiny_pair.target.tokenizer)
    healed = tiny_pair.decoder()

    def run(dec: SpeculativeDecoder, rid: str) -> tuple[RequestControl, Recorder]:
        req = request(tiny_pair, PROMPTS[0], rid=rid)
        with gov.decide(RequestInfo.from_request(req, speculation=Speculation.ON)) as control:
            rec = Recorder(control)
            dec.generate(req, rec)
        return control, rec

    control, rec = run(broken, "a")
    assert gov.breaker.state is BreakerState.OPEN
    assert rec.outcomes[-1].k == 0  # the request stopped drafting mid-way
    control, _ = run(broken, "b")
    assert control.reason == "breaker_open"
    clock.advance(10)
    control, rec = run(healed, "c")  # forced requests probe in half-open
    assert control.route.probe
    assert gov.breaker.state is BreakerState.CLOSED
    assert transitions == [("closed", "open"), ("open", "half_open"), ("half_open", "closed")]


@pytest.mark.parametrize(("draft_delay", "expect_spec"), [(0.06, False), (0.005, True)])
def test_goodput_measures_the_real_loop(tiny_pair: ModelPair, draft_delay: float, expect_spec: bool) -> None:
    """A draft step slower than a target step never pays, whatever it accepts; a cheap one does."""
    assert tiny_pair.draft is not None
    clock = FakeClock()
    target = UnreliableDraft(tiny_pair.target.lm, delay_s=0.05, sleep=clock.sleep)  # a target step costs 50 ms
    draft = UnreliableDraft(tiny_pair.draft.lm, delay_s=draft_delay, sleep=clock.sleep)
    dec = SpeculativeDecoder(target, draft, detokenizer=tiny_pair.target.tokenizer, clock=clock)
    gov = SpeculationGovernor(parse_policy({"breaker": {"enabled": False}}), clock)
    ks: list[int] = []
    for i in range(4):
        req = request(tiny_pair, PROMPTS[i % len(PROMPTS)], n=40, rid=str(i))
        with gov.decide(RequestInfo.from_request(req, speculation=Speculation.ON)) as control:
            rec = Recorder(control)
            dec.generate(req, rec)
        ks += [o.k for o in rec.outcomes]
    tail = ks[len(ks) // 2:]
    spec_share = sum(k > 0 for k in tail) / len(tail)
    if expect_spec:
        # (a few iterations explore: k=0 is measured early, as the baseline)
        assert spec_share > 0.75 and sum(tail) / len(tail) >= 3.5
    else:
        assert spec_share < 0.1
