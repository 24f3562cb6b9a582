"""The one definition of the rejection rate, and its rolling window."""

from __future__ import annotations

import pytest

from trtspec.control import FakeClock, RollingRejection, rejection_rate
from trtspec.control.rates import take_share
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


@pytest.mark.parametrize(("share", "every"), [(0.1, 10), (0.2, 5), (0.5, 2), (1 / 3, 3), (0.05, 20)])
def test_a_share_of_the_calls_is_every_nth_from_the_nth(share: float, every: int) -> None:
    credit, taken = 0.0, []
    for call in range(1, 10 * every + 1):
        credit, yes = take_share(credit, share)
        if yes:
            taken.append(call)
    assert taken == list(range(every, 10 * every + 1, every))  # 0.1 summed ten times is below 1.0 in floats


def test_no_share_never_and_all_always() -> None:
    credit, never = 0.0, []
    for _ in range(100):
        credit, yes = take_share(credit, 0.0)
        never.append(yes)
    credit, always = 0.0, []
    for _ in range(100):
        credit, yes = take_share(credit, 1.0)
        always.append(yes)
    assert not any(never) and all(always)
