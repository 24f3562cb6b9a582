"""Admission: a cap on concurrently speculating requests, by priority.

Rule: a request may speculate only if it gets a slot at once; over the cap it
runs on the target alone (it never waits, so draft work can never queue ahead
of or starve the main service). The cap is ``max_speculating`` (16), or
``soft_max_speculating`` (4) while the breaker is SOFT. A request of priority
``p`` gets a slot only while fewer than ``floor(cap * priority_share[p])``
requests speculate (defaults: high 1.0, normal 1.0, low 0.5), so low-priority
traffic leaves headroom for the rest. A slot is held until the request ends.
"""

from __future__ import annotations

import math
import threading

from trtspec.control.config import AdmissionConfig, Priority


class Admission:
    """The shared slot counter; safe to use from any thread."""

    def __init__(self, config: AdmissionConfig) -> None:
        self.config = config
        self._lock = threading.Lock()
        self._active = 0

    def limit(self, priority: Priority, degraded: bool) -> int:
        """Most concurrently speculating requests under which ``priority`` still gets a slot."""
        cap = self.config.soft_max_speculating if degraded else self.config.max_speculating
        return math.floor(cap * self.config.priority_share[priority] + 1e-9)

    def try_acquire(self, priority: Priority, degraded: bool = False) -> bool:
        """Take a slot if one is free now; never blocks."""
        limit = self.limit(priority, degraded)
        with self._lock:
            if self._active >= limit:
                return False
            self._active += 1
            return True

    def release(self) -> None:
        with self._lock:
            assert self._active > 0, "release without a matching acquire"
            self._active -= 1

    @property
    def active(self) -> int:
        """Requests holding a slot now."""
        with self._lock:
            return self._active
