"""Per-request fallback to the target alone.

Rule: after ``zero_accept_iterations`` (3) consecutive iterations that the
draft model drafted (``k > 0``) and had nothing accepted, the request stops
drafting with the model (``k = 0``, or its free drafter for ``auto``) for
``cooldown_tokens`` (32) emitted tokens, then tries the model again with a
fresh count. Iterations with ``k == 0`` and those a free drafter (``ngram``,
``suffix``) drafted neither count nor reset the streak: like the breaker, the
fallback guards the draft model, whose wrong drafts cost its draft steps; a
free drafter's cost only their rows in the target's pass, and the goodput
controller weighs those (measured on copy/edit, ``auto`` spent 40% of its
iterations target-only in fallbacks its suffix drafts had started).

An iteration whose draft model call failed or was late starts the same
cool-down (not counted as a fallback: the loop counts ``draft_errors``): a late
draft is busy, and the loop restarts it for when the cool-down ends.
"""

from __future__ import annotations

from trtspec.control.config import FallbackConfig
from trtspec.decoding.types import IterationOutcome


class FallbackGuard:
    """One request's zero-acceptance streak and cool-down. Not thread-safe (one request, one thread)."""

    def __init__(self, config: FallbackConfig) -> None:
        self.config = config
        self.zero_streak = 0
        self.cooldown_left = 0  # emitted tokens still to go on the target alone
        self.fallbacks = 0  # times this request fell back

    @property
    def active(self) -> bool:
        """True while the request must run on the target alone."""
        return self.cooldown_left > 0

    def observe(self, outcome: IterationOutcome) -> bool:
        """Learn from one iteration; True when this iteration started a fallback."""
        if not self.config.enabled:
            return False
        if outcome.draft_failed and not outcome.free_drafted:
            self.zero_streak = 0
            self.cooldown_left = max(self.cooldown_left, self.config.cooldown_tokens)
            return False
        if self.cooldown_left > 0:
            self.cooldown_left = max(0, self.cooldown_left - outcome.emitted)
            return False
        if outcome.k == 0 or outcome.free_drafted:
            return False
        if outcome.accepted > 0:
            self.zero_streak = 0
            return False
        self.zero_streak += 1
        if self.zero_streak >= self.config.zero_accept_iterations:
            self.zero_streak = 0
            self.cooldown_left = self.config.cooldown_tokens
            self.fallbacks += 1
            return True
        return False
