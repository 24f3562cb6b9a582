"""Draft-length controllers: one object per request, one documented rule each.

Each implements :class:`~trtspec.decoding.protocols.DraftLengthPolicy`:
``next_k()`` before an iteration, ``observe(outcome)`` after it. They must
tolerate ``observe`` calls without a matching ``next_k`` (the governor forces
``k = 0`` while a breaker is open or a fallback cools down, and the loop itself
stops asking once the draft failed) and must learn from ``outcome.k`` (the loop
clips ``k`` to the remaining budget), never from what they asked for.

The ``goodput`` controller lives in :mod:`trtspec.control.goodput`.
"""

from __future__ import annotations

from typing import Protocol

from trtspec.control.clock import Clock
from trtspec.control.config import HeuristicConfig, StaticConfig, StepConfig
from trtspec.control.rates import RollingRejection
from trtspec.decoding.types import IterationOutcome


class DraftLengthController(Protocol):
    """A per-request :class:`~trtspec.decoding.protocols.DraftLengthPolicy` that is told when its request ends."""

    def next_k(self) -> int: ...

    def observe(self, outcome: IterationOutcome) -> None: ...

    def finish(self) -> None: ...


class StaticController:
    """Rule: always ``k`` (``k == 0`` is plain target decoding)."""

    def __init__(self, config: StaticConfig) -> None:
        self.k = config.k

    def next_k(self) -> int:
        return self.k

    def observe(self, outcome: IterationOutcome) -> None:
        return None

    def finish(self) -> None:
        return None


class StepController:
    """Rule (what operators do by hand today): ``k`` (5), and ``k_reduced`` (3)
    while this request's rolling rejection rate is above ``threshold`` (15%).

    Hysteresis: it drops to ``k_reduced`` when the rate rises above
    ``threshold`` and returns to ``k`` only once the rate is below
    ``recover_below`` (10%), so a rate hovering around 15% does not flap. The
    window is the request's last ``window_tokens`` drafted tokens; nothing
    changes before ``min_tokens`` are in it. Rejection rate: see
    :mod:`trtspec.control.rates`.
    """

    def __init__(self, config: StepConfig, clock: Clock) -> None:
        self.config = config
        self.k = config.k
        self.window = RollingRejection(clock, window_s=None, window_tokens=config.window_tokens)

    def next_k(self) -> int:
        return self.k

    def observe(self, outcome: IterationOutcome) -> None:
        if outcome.k == 0:
            return
        self.window.observe(outcome.k, outcome.accepted)
        rate = self.window.rate()
        if rate is None or self.window.drafted < self.config.min_tokens:
            return
        if self.k == self.config.k and rate > self.config.threshold:
            self.k = self.config.k_reduced
        elif self.k == self.config.k_reduced and rate < self.config.recover_below:
            self.k = self.config.k

    def finish(self) -> None:
        return None


class HeuristicController:
    """Rule (HF transformers' ``num_assistant_tokens_schedule="heuristic"``):
    ``k + increase`` (2) after a fully accepted draft, ``k - decrease`` (1)
    otherwise, kept within ``[1, k_max]``; starts at ``initial_k``.
    """

    def __init__(self, config: HeuristicConfig, k_max: int) -> None:
        self.config = config
        self.k_max = k_max
        self.k = max(1, min(config.initial_k, k_max))

    def next_k(self) -> int:
        return self.k

    def observe(self, outcome: IterationOutcome) -> None:
        if outcome.k == 0:
            return
        if outcome.accepted == outcome.k:
            self.k = min(self.k_max, self.k + self.config.increase)
        else:
            self.k = max(1, self.k - self.config.decrease)

    def finish(self) -> None:
        return None
