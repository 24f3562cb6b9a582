"""Rollout: how much traffic speculation is exposed to, and the auto-fallback budget.

Rules:

- ``mode: off``: no request speculates; ``offline_only``: only requests marked
  offline do; ``canary``: only requests whose id falls in the canary
  (deterministic: ``sha256(request_id)`` read as a number in ``[0, 1)`` is below
  ``canary_fraction``; requests without an id get ``anon-<n>`` from a counter);
  ``full``: every request may.
- Fallback budget: of the last ``budget_window_requests`` requests that
  speculated, at most a ``fallback_budget`` share (3%) may have fallen back to
  the target alone (the 3-zero-accept rule). Above it, once
  ``budget_min_requests`` have been counted, the rollout status says
  ``budget_exceeded`` (and the transition is logged); it does not act by itself.
"""

from __future__ import annotations

import hashlib
import itertools
import logging
import threading
from collections import deque
from dataclasses import dataclass

from trtspec.control.config import RolloutConfig, RolloutMode
from trtspec.control.types import Reason, RequestInfo, Speculation

log = logging.getLogger("trtspec.control.rollout")


def canary_point(request_id: str) -> float:
    """A stable number in ``[0, 1)`` for ``request_id`` (the same in every process)."""
    digest = hashlib.sha256(request_id.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") / 2.0**64


@dataclass(frozen=True)
class RolloutStatus:
    mode: RolloutMode
    canary_fraction: float
    speculated_requests: int  # in the budget window
    fallback_requests: int  # of those, how many fell back at least once
    fallback_share: float | None
    fallback_budget: float
    budget_exceeded: bool

    def to_dict(self) -> dict:
        return {
            "mode": self.mode.value,
            "canary_fraction": self.canary_fraction,
            "speculated_requests": self.speculated_requests,
            "fallback_requests": self.fallback_requests,
            "fallback_share": self.fallback_share,
            "fallback_budget": self.fallback_budget,
            "budget_exceeded": self.budget_exceeded,
        }


class Rollout:
    """Rollout gate and fallback budget; safe to use from any thread."""

    def __init__(self, config: RolloutConfig) -> None:
        self.config = config
        self._lock = threading.Lock()
        self._window: deque[bool] = deque(maxlen=config.budget_window_requests)  # fell back?
        self._anon = itertools.count()
        self._exceeded = False

    def in_canary(self, request_id: str) -> bool:
        return canary_point(request_id) < self.config.canary_fraction

    def exclusion(self, info: RequestInfo) -> Reason | None:
        """Why the rollout keeps ``info`` from speculating, or None.
        ``speculation: on`` passes the canary draw but not ``off``/``offline_only``."""
        mode = self.config.mode
        if mode is RolloutMode.OFF:
            return Reason.ROLLOUT_OFF
        if mode is RolloutMode.OFFLINE_ONLY and not info.offline:
            return Reason.OFFLINE_ONLY
        if mode is RolloutMode.CANARY and info.speculation is not Speculation.ON:
            rid = info.request_id or f"anon-{next(self._anon)}"
            if not self.in_canary(rid):
                return Reason.CANARY_EXCLUDED
        return None

    def record(self, fell_back: bool) -> None:
        """Count one finished request that speculated."""
        with self._lock:
            self._window.append(fell_back)
            status = self._status_locked()
            changed = status.budget_exceeded != self._exceeded
            self._exceeded = status.budget_exceeded
        if changed and status.budget_exceeded:
            log.warning(
                "fallback budget exceeded: %d of the last %d speculating requests fell back (%.1f%% > %.1f%%)",
                status.fallback_requests, status.speculated_requests,
                100 * (status.fallback_share or 0.0), 100 * status.fallback_budget,
            )
        elif changed:
            log.info("fallback share back within budget (%.1f%%)", 100 * (status.fallback_share or 0.0))

    def _status_locked(self) -> RolloutStatus:
        n = len(self._window)
        fb = sum(self._window)
        share = fb / n if n else None
        exceeded = n >= self.config.budget_min_requests and share is not None and share > self.config.fallback_budget
        return RolloutStatus(
            self.config.mode, self.config.canary_fraction, n, fb, share, self.config.fallback_budget, exceeded
        )

    def status(self) -> RolloutStatus:
        with self._lock:
            return self._status_locked()
