"""Fallback: 3 consecutive zero-accept iterations -> target alone for a cool-down, then retry."""

from __future__ import annotations

import dataclasses

import pytest

from trtspec.control import FallbackGuard
from trtspec.control.config import FallbackConfig
from trtspec.decoding.types import IterationOutcome


def outcome(k: int, accepted: int, emitted: int | None = None) -> IterationOutcome:
    return IterationOutcome(k, accepted, accepted + 1 if emitted is None else emitted, False, 50, 0.0, 0.0)


def test_three_zero_accept_iterations_start_a_cooldown_then_it_retries() -> None:
    g = FallbackGuard(FallbackConfig(zero_accept_iterations=3, cooldown_tokens=4))
    assert not g.observe(outcome(5, 0))
    assert not g.observe(outcome(5, 0))
    assert not g.active
    assert g.observe(outcome(5, 0))  # the third: fallback starts
    assert g.active and g.fallbacks == 1
    g.observe(outcome(0, 0))  # 1 token on the target alone
    g.observe(outcome(0, 0))
    g.observe(outcome(0, 0))
    assert g.active
    g.observe(outcome(0, 0))  # the 4th token: cool-down over
    assert not g.active
    # a fresh count: two more zero-accepts do not trip it again
    g.observe(outcome(5, 0))
    g.observe(outcome(5, 0))
    assert not g.active
    g.observe(outcome(5, 0))
    assert g.active and g.fallbacks == 2


def test_any_accepted_token_resets_the_streak() -> None:
    g = FallbackGuard(FallbackConfig())
    for acc in [0, 0, 1, 0, 0, 2, 0, 0]:
        g.observe(outcome(4, acc))
    assert not g.active and g.fallbacks == 0


def test_target_only_steps_neither_count_nor_reset() -> None:
    g = FallbackGuard(FallbackConfig())
    g.observe(outcome(4, 0))
    g.observe(outcome(0, 0))
    g.observe(outcome(4, 0))
    g.observe(outcome(0, 0))
    assert not g.active
    g.observe(outcome(4, 0))
    assert g.active


def test_cooldown_counts_emitted_tokens() -> None:
    g = FallbackGuard(FallbackConfig(zero_accept_iterations=1, cooldown_tokens=10))
    g.observe(outcome(3, 0))
    g.observe(outcome(0, 0, emitted=9))
    assert g.active and g.cooldown_left == 1
    g.observe(outcome(0, 0, emitted=1))
    assert not g.active


def test_disabled_never_falls_back() -> None:
    g = FallbackGuard(FallbackConfig(enabled=False))
    for _ in range(10):
        g.observe(outcome(5, 0))
    assert not g.active and g.fallbacks == 0


@pytest.mark.parametrize("drafter", ["ngram", "suffix"])
def test_a_free_drafters_rejections_neither_count_nor_reset(drafter: str) -> None:
    g = FallbackGuard(FallbackConfig())
    free = dataclasses.replace(outcome(5, 0), drafter=drafter)
    g.observe(outcome(4, 0))
    g.observe(outcome(4, 0))
    for _ in range(10):  # a lookup's wrong drafts cost only rows of the target's pass
        assert not g.observe(free)
    assert not g.active
    assert g.observe(dataclasses.replace(outcome(4, 0), drafter="model"))  # the model's third
    assert g.active
