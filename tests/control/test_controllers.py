"""static, step and heuristic controllers, driven by scripted acceptance sequences."""

from __future__ import annotations

from trtspec.control import FakeClock, HeuristicController, StaticController, StepController
from trtspec.control.config import HeuristicConfig, StaticConfig, StepConfig
from trtspec.decoding.types import IterationOutcome


def outcome(k: int, accepted: int) -> IterationOutcome:
    return IterationOutcome(k, accepted, accepted + 1, k > 0 and accepted == k, 100, 0.01 * k, 0.05)


def run(controller, script: list[int]) -> list[int]:
    """Feed ``script`` (accepted tokens per iteration, capped at k) and return the k asked before each."""
    ks = []
    for acc in script:
        k = controller.next_k()
        ks.append(k)
        controller.observe(outcome(k, min(acc, k)))
    return ks


def test_static_is_constant() -> None:
    c = StaticController(StaticConfig(k=4))
    assert run(c, [0, 4, 1, 0, 4]) == [4] * 5
    assert run(StaticController(StaticConfig(k=0)), [0, 0]) == [0, 0]


def test_step_drops_to_3_above_15_percent_and_comes_back_below_10(clock: FakeClock) -> None:
    c = StepController(StepConfig(window_tokens=20, min_tokens=10), clock)
    assert run(c, [5, 5, 4, 4]) == [5, 5, 5, 5]
    assert c.window.rate() == 0.10  # 2 of the last 20 drafted rejected: not above 15%
    assert c.next_k() == 5
    run(c, [3])  # window: 5,4,4,3 of 5 accepted = 16 of 20 -> 20% > 15%
    assert c.window.rate() == 0.20
    assert c.next_k() == 3
    ks = run(c, [3, 3, 3, 3, 3])  # all accepted at k=3; the rate falls 17%, 19%, 17%, 14%, 10%
    assert ks == [3] * 5
    assert c.window.rate() == 0.10  # not below 10%: still 3 (15% would have switched back already)
    assert c.next_k() == 3
    run(c, [3])  # 2 of 23 -> 8.7% < 10%
    assert c.next_k() == 5


def test_step_does_not_flap_between_the_thresholds(clock: FakeClock) -> None:
    c = StepController(StepConfig(window_tokens=30, min_tokens=10), clock)
    run(c, [0, 0, 0])
    assert c.next_k() == 3
    run(c, [3, 3, 2] * 3)  # refill the window
    rates, ks = [], []
    for acc in [3, 3, 2] * 6:
        ks += run(c, [acc])
        rates.append(c.window.rate())
    # the rate sits between 10% and 15%: a single 15% threshold would switch back to 5 here
    assert all(0.10 <= r < 0.15 for r in rates), rates
    assert set(ks) == {3}


def test_step_waits_for_min_tokens(clock: FakeClock) -> None:
    c = StepController(StepConfig(window_tokens=40, min_tokens=10), clock)
    assert run(c, [0]) == [5]  # 100% rejected, but only 5 tokens in the window
    assert c.next_k() == 5
    run(c, [0])
    assert c.next_k() == 3


def test_step_ignores_plain_target_steps(clock: FakeClock) -> None:
    c = StepController(StepConfig(window_tokens=20, min_tokens=10), clock)
    for _ in range(10):
        c.observe(outcome(0, 0))
    assert c.window.drafted == 0 and c.next_k() == 5


def test_heuristic_plus_two_on_full_accept_minus_one_otherwise() -> None:
    c = HeuristicController(HeuristicConfig(initial_k=5), k_max=8)
    # full (+2), full (+2, capped at 8), partial (-1), zero (-1), zero (-1), full (+2)
    assert run(c, [5, 7, 3, 0, 0, 99]) == [5, 7, 8, 7, 6, 5]
    assert c.next_k() == 7


def test_heuristic_stays_within_1_and_k_max() -> None:
    c = HeuristicController(HeuristicConfig(initial_k=2), k_max=4)
    assert run(c, [0, 0, 0, 1, 9, 9, 9]) == [2, 1, 1, 1, 3, 4, 4]


def test_heuristic_learns_from_the_clipped_k() -> None:
    c = HeuristicController(HeuristicConfig(initial_k=5), k_max=8)
    c.next_k()
    c.observe(outcome(2, 2))  # the loop clipped k to 2 (end of budget) and both were accepted
    assert c.next_k() == 7
