"""The facade: decision order and reasons, per-iteration caps, fallback, breaker, admission, threads."""

from __future__ import annotations

import dataclasses
import threading

import pytest

from trtspec.control import (
    BreakerState,
    FakeClock,
    Policy,
    Priority,
    RequestInfo,
    Speculation,
    SpeculationGovernor,
    parse_policy,
)
from trtspec.decoding.types import DrafterKind, IterationOutcome

LONG = 100  # context tokens: the long_context rule speculates


def outcome(k: int, accepted: int, emitted: int | None = None) -> IterationOutcome:
    return IterationOutcome(k, accepted, accepted + 1 if emitted is None else emitted, k > 0 and accepted == k,
                            LONG, 0.01 * k, 0.05)


def policy(**sections) -> Policy:
    base = {"draft_length": {"controller": "static"}}  # k = 5, predictable
    base.update(sections)
    return parse_policy(base)


def info(rid: str = "r", context: int = LONG, **kw) -> RequestInfo:
    return RequestInfo(request_id=rid, context_tokens=context, max_new_tokens=64, **kw)


def open_breaker(gov: SpeculationGovernor) -> None:
    with gov.decide(info("opener")) as c:
        for _ in range(30):
            c.next_k()
            c.observe(outcome(5, 0))
    assert gov.breaker.state is BreakerState.OPEN


# -- decisions and reasons ----------------------------------------------------------


def test_router_reasons(clock: FakeClock) -> None:
    gov = SpeculationGovernor(policy(), clock)
    assert gov.decide(info(context=LONG, priority=Priority.HIGH)).reason == "long_context"
    c = gov.decide(info(context=10, priority=Priority.HIGH))
    assert (c.speculate, c.reason) == (False, "high_priority")
    assert gov.decide(info(context=10)).reason == "default"


def test_off_always_wins_and_on_skips_the_router(clock: FakeClock) -> None:
    gov = SpeculationGovernor(policy(), clock)
    c = gov.decide(info(context=LONG, speculation=Speculation.OFF))
    assert (c.speculate, c.reason) == (False, "request_off")
    c = gov.decide(info(context=10, priority=Priority.HIGH, speculation=Speculation.ON))
    assert (c.speculate, c.reason) == (True, "forced_on")


def test_rollout_reasons(clock: FakeClock) -> None:
    gov = SpeculationGovernor(policy(rollout={"mode": "off"}), clock)
    assert gov.decide(info(speculation=Speculation.ON)).reason == "rollout_off"
    gov = SpeculationGovernor(policy(rollout={"mode": "canary", "canary_fraction": 0.0}), clock)
    assert gov.decide(info()).reason == "canary_excluded"
    assert gov.decide(info(speculation=Speculation.ON)).speculate


def test_quota_runs_on_the_target_at_once(clock: FakeClock) -> None:
    gov = SpeculationGovernor(policy(admission={"max_speculating": 2, "soft_max_speculating": 1}), clock)
    a, b = gov.decide(info("a")), gov.decide(info("b"))
    c = gov.decide(info("c"))
    assert (a.speculate, b.speculate, c.speculate, c.reason) == (True, True, False, "quota")
    assert c.next_k() == 0
    assert gov.decide(info("d", speculation=Speculation.ON)).reason == "quota"  # on does not pass the cap
    a.finish()
    a.finish()  # idempotent: releases once
    assert gov.snapshot().speculating_now == 1
    with gov.decide(info("e")) as e:
        assert e.speculate and gov.snapshot().speculating_now == 2
    assert gov.snapshot().speculating_now == 1


def test_slot_is_released_when_the_request_fails(clock: FakeClock) -> None:
    gov = SpeculationGovernor(policy(), clock)
    with pytest.raises(RuntimeError):
        with gov.decide(info()):
            raise RuntimeError("client went away")
    assert gov.snapshot().speculating_now == 0


def test_open_breaker_stops_even_forced_requests(clock: FakeClock) -> None:
    gov = SpeculationGovernor(policy(), clock)
    open_breaker(gov)
    for sp in (Speculation.AUTO, Speculation.ON):
        c = gov.decide(info(speculation=sp))
        assert (c.speculate, c.reason, c.route.breaker_state) == (False, "breaker_open", "open")
    assert gov.snapshot().speculating_now == 0  # the slot taken for the check was given back


def test_free_drafters_neither_feed_nor_obey_the_breaker(clock: FakeClock) -> None:
    gov = SpeculationGovernor(policy(), clock)
    for drafter in (DrafterKind.NGRAM, DrafterKind.SUFFIX):
        with gov.decide(info(drafter=drafter)) as c:
            for _ in range(40):  # 200 drafted tokens, all rejected: would open it twice over
                c.next_k()
                c.observe(dataclasses.replace(outcome(5, 0), drafter=drafter.value))
    assert gov.breaker.state is BreakerState.CLOSED and gov.breaker.snapshot().window_drafted == 0
    open_breaker(gov)  # the draft model's rejections do open it
    for drafter in (DrafterKind.NGRAM, DrafterKind.SUFFIX):
        c = gov.decide(info(drafter=drafter))
        assert c.speculate and c.next_k() == 5
        c.finish()
    c = gov.decide(info(drafter=DrafterKind.MODEL))
    assert (c.speculate, c.reason) == (False, "breaker_open")


def test_auto_drafts_with_its_free_drafter_while_the_breaker_bars_the_model(clock: FakeClock) -> None:
    gov = SpeculationGovernor(policy(draft_length={"controller": "goodput"}), clock)
    with gov.decide(info(drafter=DrafterKind.AUTO)) as closed:
        assert closed.next_drafter(["suffix", "model"]) in ("suffix", "model")
        offered = []
        closed.controller.next_drafter = lambda names: offered.append(tuple(names)) or names[-1]
        assert closed.next_drafter(["suffix", "model"]) == "model"
    open_breaker(gov)
    c = gov.decide(info(drafter=DrafterKind.AUTO))
    assert c.speculate and not c.route.probe and c.route.breaker_state == "open"
    c.controller.next_drafter = lambda names: offered.append(tuple(names)) or names[-1]
    assert c.next_drafter(["suffix", "model"]) == "suffix"
    assert offered == [("suffix", "model"), ("suffix",)]  # the model is not offered while barred
    c.next_k()
    assert c.last_cause == "controller"  # the free drafter's k is the controller's, not capped
    assert c.next_drafter(["model"]) == "model" and c.next_k() == 0  # nothing else open: no draft
    assert c.last_cause == "breaker"
    c.finish()


def test_draft_unavailable(clock: FakeClock) -> None:
    gov = SpeculationGovernor(policy(), clock)
    gov.set_draft_available(False)
    assert gov.decide(info(speculation=Speculation.ON)).reason == "draft_unavailable"
    gov.set_draft_available(True)
    assert gov.decide(info()).speculate


def test_decisions_are_counted_by_reason(clock: FakeClock) -> None:
    gov = SpeculationGovernor(policy(), clock)
    for ctx in (LONG, LONG, 10):
        gov.decide(info(context=ctx, priority=Priority.HIGH)).finish()
    snap = gov.snapshot()
    assert snap.decisions == {"long_context": 2, "high_priority": 1}
    assert snap.requests_total == 3


# -- per iteration ---------------------------------------------------------------


def test_soft_breaker_halves_k_max_and_lowers_the_cap(clock: FakeClock) -> None:
    gov = SpeculationGovernor(policy(draft_length={"controller": "static", "k_max": 8, "static": {"k": 7}}), clock)
    c = gov.decide(info("a"))
    assert c.next_k() == 7
    for _ in range(30):  # 1 of 4 rejected: 25%, over 120 tokens (min_tokens 100)
        c.observe(outcome(4, 3))
    assert gov.breaker.state is BreakerState.SOFT
    assert c.next_k() == 4  # k_max 8 halved
    snap = gov.snapshot()
    assert (snap.k_max_now, snap.admission_limit) == (4, 4)


def test_open_breaker_stops_running_requests_and_half_open_lets_probes_draft(clock: FakeClock) -> None:
    p = policy(breaker={"half_open_fraction": 0.5, "cooldown_s": 30, "half_open_min_tokens": 20})
    gov = SpeculationGovernor(p, clock)
    running = gov.decide(info("running"))
    assert running.next_k() == 5
    open_breaker(gov)
    assert running.next_k() == 0 and running.last_cause == "breaker"
    clock.advance(30)
    routes = [gov.decide(info(f"h{i}")) for i in range(4)]
    assert [c.speculate for c in routes] == [False, True, False, True]
    assert routes[0].reason == "breaker_half_open" and routes[1].route.probe
    assert running.next_k() == 0  # not a probe: stays on the target while the breaker measures
    probe = routes[1]
    assert probe.next_k() == 5
    for _ in range(4):
        probe.observe(outcome(5, 5))
    assert gov.breaker.state is BreakerState.CLOSED
    assert running.next_k() == 5  # closed again: everyone drafts


def test_fallback_after_three_zero_accepts_then_retry(clock: FakeClock) -> None:
    gov = SpeculationGovernor(policy(fallback={"cooldown_tokens": 3}, breaker={"enabled": False}), clock)
    c = gov.decide(info())
    ks = []
    script = [0, 0, 0, None, None, None, 2]  # accepted per iteration; None: a plain target step
    for acc in script:
        k = c.next_k()
        ks.append(k)
        c.observe(outcome(k, 0 if acc is None else min(acc, k)))
    assert ks == [5, 5, 5, 0, 0, 0, 5]
    assert gov.snapshot().fallbacks_total == 1
    c.finish()
    st = gov.snapshot().rollout
    assert (st.speculated_requests, st.fallback_requests) == (1, 1)


def test_a_failed_or_late_draft_rests_the_model_for_the_cooldown_without_counting_a_fallback(
        clock: FakeClock) -> None:
    gov = SpeculationGovernor(policy(fallback={"cooldown_tokens": 3}, breaker={"enabled": False}), clock)
    c = gov.decide(info())
    assert c.next_k() == 5
    c.observe(dataclasses.replace(outcome(0, 0), draft_failed=True, drafter="model"))  # its proposal never came
    ks = []
    for _ in range(4):
        ks.append(c.next_k())
        c.observe(outcome(ks[-1], 0))
    assert ks == [0, 0, 0, 5] and c.last_cause == "controller"  # 3 tokens on the target alone, then the model
    assert gov.snapshot().fallbacks_total == 0  # a draft error is counted as such, not as a fallback
    free = gov.decide(info("free", drafter=DrafterKind.AUTO))
    free.observe(dataclasses.replace(outcome(0, 0), draft_failed=True, drafter="suffix"))
    assert not free.fallback.active  # the fallback guards the draft model only
    c.finish()
    free.finish()


def test_a_fallen_back_auto_request_drafts_with_its_free_drafter(clock: FakeClock) -> None:
    gov = SpeculationGovernor(policy(draft_length={"controller": "goodput"}, breaker={"enabled": False}), clock)
    c = gov.decide(info(drafter=DrafterKind.AUTO))
    offered = []
    c.controller.next_drafter = lambda names: offered.append(tuple(names)) or names[-1]
    for _ in range(3):  # the model's drafts all rejected: the fallback starts
        assert c.next_drafter(["suffix", "model"]) == "model"
        c.observe(dataclasses.replace(outcome(4, 0), drafter="model"))
    assert c.fallback.active and gov.snapshot().fallbacks_total == 1
    assert c.next_drafter(["suffix", "model"]) == "suffix"  # the model is not offered while it cools down
    assert offered[-1] == ("suffix",)
    c.next_k()
    assert c.last_cause == "controller"  # the free drafter's k is the controller's
    assert c.next_drafter(["model"]) == "model" and c.next_k() == 0 and c.last_cause == "fallback"
    assert c.why == "model:fallback"
    c.finish()


def test_not_speculating_requests_never_draft_but_teach_the_cost_model(clock: FakeClock) -> None:
    gov = SpeculationGovernor(Policy(), clock)
    c = gov.decide(info(speculation=Speculation.OFF))
    for _ in range(6):
        assert c.next_k() == 0
        c.observe(outcome(0, 0))
    c.finish()
    assert gov.goodput.costs.verify[0].n == 5  # the first iteration (prefill) left out
    assert gov.snapshot().rollout.speculated_requests == 0


def test_snapshot_reports_state_rate_count_and_k(clock: FakeClock) -> None:
    gov = SpeculationGovernor(policy(), clock)
    c = gov.decide(info())
    c.next_k()
    c.observe(outcome(5, 4))
    snap = gov.snapshot().to_dict()
    assert snap["breaker"]["state"] == "closed"
    assert snap["breaker"]["rejection_rate"] == pytest.approx(0.2)
    assert (snap["speculating_now"], snap["last_k"], snap["k_max_now"]) == (1, 5, 8)
    assert snap["goodput"] is None  # the static controller has no estimates
    assert SpeculationGovernor(Policy(), clock).snapshot().goodput is not None


def test_snapshot_counts_why_each_k_was_chosen(clock: FakeClock) -> None:
    """``k_choices``: speculating iterations by ``drafter:reason`` (what ``trtspec status`` prints)."""
    static = SpeculationGovernor(policy(), clock)
    c = static.decide(info())
    for _ in range(3):
        c.next_k()
        c.observe(outcome(5, 5))
    off = static.decide(info(speculation=Speculation.OFF))  # not speculating: not counted
    off.next_k()
    assert static.snapshot().k_choices == {"model:controller": 3}
    gov = SpeculationGovernor(policy(draft_length={"controller": "goodput"}, breaker={"enabled": False}), clock)
    c = gov.decide(info())
    reasons = []
    for _ in range(6):
        k = c.next_k()
        reasons.append(c.why)
        c.observe(outcome(k, k))
    assert reasons[0] == "model:best" and all(r.startswith("model:") for r in reasons)
    assert gov.snapshot().k_choices == {r: reasons.count(r) for r in set(reasons)}


def test_breaker_listener_sees_transitions_caused_by_requests(clock: FakeClock) -> None:
    seen = []

    class Listener:
        def on_transition(self, old, new, reason, rate) -> None:
            seen.append((old.value, new.value, reason))

    gov = SpeculationGovernor(policy(), clock, breaker_listeners=[Listener()])
    open_breaker(gov)
    assert seen == [("closed", "open", "hard_threshold_exceeded")]


def test_many_threads(clock: FakeClock) -> None:
    gov = SpeculationGovernor(policy(admission={"max_speculating": 3, "soft_max_speculating": 1},
                                     breaker={"enabled": False}), clock)
    errors: list[BaseException] = []
    start = threading.Barrier(6)

    def worker(w: int) -> None:
        try:
            start.wait()
            for i in range(200):
                with gov.decide(info(f"{w}-{i}")) as c:
                    assert gov.snapshot().speculating_now <= 3
                    for _ in range(3):
                        k = c.next_k()
                        c.observe(outcome(k, k))
        except BaseException as e:  # surfaced below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(w,)) for w in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    snap = gov.snapshot()
    assert snap.speculating_now == 0
    assert snap.requests_total == 1200
    assert snap.decisions.get("long_context", 0) + snap.decisions.get("quota", 0) == 1200
