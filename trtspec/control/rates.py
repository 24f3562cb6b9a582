"""The rejection rate, defined once for the whole control plane.

**Rejection rate** over a window of iterations::

    rejection_rate = 1 - accepted / drafted

where ``drafted`` is the number of draft tokens proposed in the window (the
sum of ``k`` over its iterations; plain target steps, ``k == 0``, add nothing)
and ``accepted`` the number of those the target's verification kept. Bonus and
correction tokens are NOT counted on either side. It is undefined (``None``)
when nothing was drafted. This is ``1 - SpecStats.acceptance_rate`` computed
over the window instead of over one request, and it is what the ``step``
controller, the circuit breaker, metrics and docs all mean by the word.

Note that the rate depends on ``k``: later draft positions are accepted less
often, so longer drafts show a higher rejection rate for the same draft model.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from trtspec.control.clock import Clock


def rejection_rate(drafted: int, accepted: int) -> float | None:
    """``1 - accepted / drafted``; ``None`` when ``drafted == 0``."""
    assert 0 <= accepted <= drafted, f"accepted={accepted} must be in [0, drafted={drafted}]"
    return (drafted - accepted) / drafted if drafted else None  # == 1 - accepted / drafted, exactly


@dataclass(frozen=True)
class _Event:
    t: float
    drafted: int
    accepted: int


class RollingRejection:
    """Rejection rate over a rolling window bounded by time AND by count.

    The window holds the most recent iterations that are at most ``window_s``
    seconds old (``None``: no time bound) and, of those, only as many of the
    newest as hold ``window_tokens`` drafted tokens (the oldest iteration is
    dropped once the rest still hold ``window_tokens``; ``None``: no count
    bound). Not thread-safe: the owner locks.
    """

    def __init__(self, clock: Clock, window_s: float | None = None, window_tokens: int | None = None) -> None:
        assert window_s is None or window_s > 0
        assert window_tokens is None or window_tokens > 0
        self._clock = clock
        self.window_s = window_s
        self.window_tokens = window_tokens
        self._events: deque[_Event] = deque()
        self._drafted = 0
        self._accepted = 0

    def observe(self, drafted: int, accepted: int) -> None:
        """Add one iteration (``drafted == 0`` iterations are ignored)."""
        assert 0 <= accepted <= drafted
        if drafted == 0:
            return
        self._events.append(_Event(self._clock(), drafted, accepted))
        self._drafted += drafted
        self._accepted += accepted
        self._trim()

    def clear(self) -> None:
        self._events.clear()
        self._drafted = self._accepted = 0

    def _drop_oldest(self) -> None:
        e = self._events.popleft()
        self._drafted -= e.drafted
        self._accepted -= e.accepted

    def _trim(self) -> None:
        if self.window_s is not None:
            horizon = self._clock() - self.window_s
            while self._events and self._events[0].t < horizon:
                self._drop_oldest()
        if self.window_tokens is not None:
            while self._events and self._drafted - self._events[0].drafted >= self.window_tokens:
                self._drop_oldest()

    @property
    def drafted(self) -> int:
        """Drafted tokens now in the window."""
        self._trim()
        return self._drafted

    @property
    def accepted(self) -> int:
        self._trim()
        return self._accepted

    def rate(self) -> float | None:
        """The rejection rate over the window (see the module docstring)."""
        self._trim()
        return rejection_rate(self._drafted, self._accepted)
