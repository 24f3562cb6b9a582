"""The planner's arithmetic against values computed by hand (the working is in the comments)."""

from __future__ import annotations

import pytest

from trtspec.plan import model


def test_leviathan_speedup_hand_values() -> None:
    # alpha 0.8, k 4: E = (1 - 0.8^5) / 0.2 = (1 - 0.32768) / 0.2 = 3.3616; cost 4 * 0.1 + 1 = 1.4
    assert model.expected_tokens(0.8, 4) == pytest.approx(3.3616)
    assert model.leviathan_speedup(0.8, 4, 0.1) == pytest.approx(3.3616 / 1.4)
    # alpha 0.5, k 2: E = (1 - 0.125) / 0.5 = 1.75; cost 2 * 0.5 + 1 = 2 -> 0.875 (slower than the target alone)
    assert model.leviathan_speedup(0.5, 2, 0.5) == pytest.approx(0.875)
    # alpha 1: every draft accepted, k + 1 tokens per iteration; free drafts -> 4x
    assert model.leviathan_speedup(1.0, 3, 0.0) == pytest.approx(4.0)
    # k 0: one token per target step
    assert model.leviathan_speedup(0.7, 0, 0.3) == pytest.approx(1.0)


def test_acceptance_rate_and_its_inverse() -> None:
    # (0.8 + 0.64 + 0.512 + 0.4096) / 4 = 0.5904
    assert model.acceptance_rate(0.8, 4) == pytest.approx(0.5904)
    # k 2, alpha 0.5: (0.5 + 0.25) / 2 = 0.375
    assert model.alpha_from_rate(0.375, 2) == pytest.approx(0.5, abs=1e-9)
    assert model.alpha_from_rate(0.5904, 4) == pytest.approx(0.8, abs=1e-9)
    assert model.alpha_from_rate(0.42, 1) == 0.42  # k 1: the rate is alpha
    assert model.alpha_from_rate(0.0, 5) == 0.0 and model.alpha_from_rate(1.0, 5) == 1.0


def test_effective_c_folds_the_verify_cost_in() -> None:
    # an iteration of 300 ms against a 100 ms target step at k 4: 3 steps = 4c + 1 -> c = 0.5
    assert model.effective_c(0.3, 0.1, 4) == pytest.approx(0.5)
    # an iteration cheaper than a step (measurement noise) is clamped at 0
    assert model.effective_c(0.09, 0.1, 4) == 0.0


def test_optimal_k_hand_values() -> None:
    # alpha 0.8, c 0.1: k 5 -> 3.68928/1.5 = 2.4595, k 6 -> 3.951424/1.6 = 2.4696, k 7 -> 4.1611392/1.7 = 2.4477
    assert model.optimal_k(0.8, 0.1, 8) == 6
    assert model.optimal_k(0.8, 0.1, 4) == 4  # capped
    # alpha 0.5, c 0.5: k 1 -> 1.5/1.5 = 1.0, k 2 -> 0.875: the smallest k
    assert model.optimal_k(0.5, 0.5, 8) == 1


def test_load_factor_interpolates_between_bench_rates() -> None:
    pts = [(5.0, 0.9), (1.0, 1.2), (20.0, 0.6)]  # unsorted on purpose
    assert model.load_factor(pts, 0.5) == 1.0  # below the lowest rate: unloaded
    assert model.load_factor(pts, 1.0) == 1.0
    # at 3 req/s: 1.2 + (0.9 - 1.2) * (3 - 1) / (5 - 1) = 1.05; / 1.2 = 0.875
    assert model.load_factor(pts, 3.0) == pytest.approx(0.875)
    # at 10 req/s: 0.9 + (0.6 - 0.9) * 5 / 15 = 0.8; / 1.2
    assert model.load_factor(pts, 10.0) == pytest.approx(0.8 / 1.2)
    assert model.load_factor(pts, 40.0) == pytest.approx(0.5)  # beyond: the last point's
    assert model.load_factor([], 3.0) == 1.0


def test_break_even_rate() -> None:
    # between (1, 1.2) and (5, 0.9): 1 + 4 * (1.2 - 1) / (1.2 - 0.9) = 3.6667
    assert model.break_even_rate([(1.0, 1.2), (5.0, 0.9), (20.0, 0.6)]) == pytest.approx(1 + 4 * 0.2 / 0.3)
    assert model.break_even_rate([(1.0, 1.2), (5.0, 1.1)]) is None  # always pays
    assert model.break_even_rate([(1.0, 0.9), (5.0, 0.8)]) is None  # never pays


def test_overall_speedup_is_token_weighted_harmonic() -> None:
    # 100 tokens at 2x and 300 at 1x: 400 / (50 + 300) = 1.142857
    assert model.overall_speedup([100, 300], [2.0, 1.0]) == pytest.approx(400 / 350)


def test_gpu_hours() -> None:
    # 8640 requests/day x 200 tokens / 100 tokens/s = 17280 s = 4.8 h
    assert model.gpu_hours_per_day(8640, 200, 100) == pytest.approx(4.8)
    assert model.gpus_needed(4.8) == 1
    assert model.gpus_needed(24.0) == 1
    assert model.gpus_needed(24.1) == 2
