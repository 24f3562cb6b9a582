"""The one definition of the rejection rate, and its rolling window."""

from __future__ import annotations

import pytest

from trtspec.control import FakeClock, RollingRejection, rejection_rate
from trtspec.decoding.types import IterationOutcome, SpecStats


def test_rejection_rate_is_one_minus_accepted_over_drafted() -> None:
    assert rejection_rate(10, 8) == pytest.approx(0.2)
    assert rejection_rate(5, 5) == 0.0
    assert rejection_rate(5, 0) == 1.0
    assert rejection_rate(0, 0) is None  # nothing drafted: undefined


def test_same_definition_as_the_loop_stats() -> None:
    stats = SpecStats()
    for k, acc in [(5, 5), (5, 2), (3, 0), (0, 0)]:
        stats.observe(IterationOutcome(k, acc, acc + 1, acc == k and k > 0, 10, 0.0, 0.0))
    assert stats.acceptance_rate is not None
    assert rejection_rate(stats.drafted_tokens, stats.accepted_tokens) == pytest.approx(1 - stats.acceptance_rate)


def test_window_by_count_keeps_the_newest_tokens(clock: FakeClock) -> None:
    w = RollingRejection(clock, window_tokens=10)
    w.observe(5, 0)  # will fall out
    w.observe(5, 5)
    w.observe(5, 5)
    assert (w.drafted, w.accepted) == (10, 10)
    assert w.rate() == 0.0
    w.observe(0, 0)  # plain target steps add nothing
    assert w.drafted == 10


def test_window_by_time_drops_old_iterations(clock: FakeClock) -> None:
    w = RollingRejection(clock, window_s=10.0, window_tokens=1000)
    w.observe(4, 0)
    clock.advance(6)
    w.observe(4, 4)
    assert w.rate() == pytest.approx(0.5)
    clock.advance(5)  # the first iteration is now 11 s old
    assert w.rate() == 0.0
    clock.advance(10)
    assert w.rate() is None and w.drafted == 0
