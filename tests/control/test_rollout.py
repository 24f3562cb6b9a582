"""Rollout: modes, a deterministic canary share, the fallback budget."""

from __future__ import annotations

import logging

import pytest

from trtspec.control import Reason, RequestInfo, Rollout, Speculation
from trtspec.control.config import RolloutConfig, RolloutMode
from trtspec.control.rollout import canary_point


def rollout(**kw) -> Rollout:
    return Rollout(RolloutConfig(**kw))


def test_canary_share_is_within_tolerance() -> None:
    r = rollout(mode=RolloutMode.CANARY, canary_fraction=0.1)
    n = 20_000
    inside = sum(r.exclusion(RequestInfo(request_id=f"req-{i}")) is None for i in range(n))
    # binomial: sd = sqrt(n p (1-p)) = 42; allow 4 sd
    assert abs(inside - 0.1 * n) < 4 * (n * 0.1 * 0.9) ** 0.5


def test_canary_is_deterministic_by_request_id() -> None:
    r1 = rollout(mode=RolloutMode.CANARY, canary_fraction=0.3)
    r2 = rollout(mode=RolloutMode.CANARY, canary_fraction=0.3)
    ids = [f"id-{i}" for i in range(200)]
    assert [r1.exclusion(RequestInfo(request_id=i)) for i in ids] == [r2.exclusion(RequestInfo(request_id=i))
                                                                       for i in ids]
    assert canary_point("abc") == canary_point("abc")
    # a larger fraction keeps everyone already inside
    r3 = rollout(mode=RolloutMode.CANARY, canary_fraction=0.6)
    for i in ids:
        if r1.in_canary(i):
            assert r3.in_canary(i)


def test_canary_excludes_with_a_reason_and_on_passes_the_draw() -> None:
    r = rollout(mode=RolloutMode.CANARY, canary_fraction=0.0)
    assert r.exclusion(RequestInfo(request_id="x")) is Reason.CANARY_EXCLUDED
    assert r.exclusion(RequestInfo(request_id="x", speculation=Speculation.ON)) is None


def test_canary_without_request_ids_still_samples() -> None:
    r = rollout(mode=RolloutMode.CANARY, canary_fraction=0.5)
    inside = sum(r.exclusion(RequestInfo()) is None for _ in range(2000))
    assert 800 < inside < 1200


def test_off_and_offline_only() -> None:
    assert rollout(mode=RolloutMode.OFF).exclusion(RequestInfo(speculation=Speculation.ON)) is Reason.ROLLOUT_OFF
    r = rollout(mode=RolloutMode.OFFLINE_ONLY)
    assert r.exclusion(RequestInfo()) is Reason.OFFLINE_ONLY
    assert r.exclusion(RequestInfo(speculation=Speculation.ON)) is Reason.OFFLINE_ONLY
    assert r.exclusion(RequestInfo(offline=True)) is None
    assert rollout(mode=RolloutMode.FULL).exclusion(RequestInfo()) is None


def test_fallback_budget(caplog: pytest.LogCaptureFixture) -> None:
    r = rollout(fallback_budget=0.03, budget_min_requests=20, budget_window_requests=100)
    for _ in range(19):
        r.record(fell_back=False)
    r.record(fell_back=True)  # 1 of 20 = 5% > 3%
    st = r.status()
    assert st.fallback_share == pytest.approx(0.05) and st.budget_exceeded
    with caplog.at_level(logging.INFO, logger="trtspec.control.rollout"):
        for _ in range(20):
            r.record(fell_back=False)  # 1 of 40 = 2.5%
    assert not r.status().budget_exceeded
    assert "back within budget" in caplog.text


def test_budget_needs_enough_requests() -> None:
    r = rollout(budget_min_requests=20)
    r.record(fell_back=True)
    st = r.status()
    assert st.fallback_share == 1.0 and not st.budget_exceeded


def test_budget_counts_a_rolling_window_of_requests() -> None:
    r = rollout(budget_window_requests=50, budget_min_requests=10)
    for _ in range(10):
        r.record(fell_back=True)
    for _ in range(50):
        r.record(fell_back=False)
    st = r.status()
    assert (st.speculated_requests, st.fallback_requests, st.budget_exceeded) == (50, 0, False)
