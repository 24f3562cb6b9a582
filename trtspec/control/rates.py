"""The rejection rate, defined once for the whole control plane.

**Rejection rate** over a window of iterations::

    rejection_rate = 1 - accepted / drafted

where ``drafted`` is the number of draft tokens proposed in the window (the
sum of ``k`` over its iterations; plain target steps, ``k == 0``, add nothing)
and ``accepted`` the number of those the target's verification kept. Bonus and
correction tokens are NOT counted on either side. It is undefined (``None``)
when nothing was drafted. This is ``1 - SpecStats.acceptance_rate`` computed
over the window instead of over one request, and it is what the ``step``
controller, metrics and docs mean by the word.

The rate depends on ``k``: a drafted token after the first rejected one is
never tested and counts as rejected, so longer drafts show a higher rejection
rate for the same draft model (the demo pair: ~4% at ``k = 1``, ~17% at
``k = 5`` measured, and ~20-23% at ``k = 8`` for its ~0.94-0.95 acceptance per position).

**Rejection rate per tested position** (what the circuit breaker watches)::

    position_rejection_rate = 1 - accepted / tested

where ``tested`` counts the draft positions verification tested: each
iteration's accepted ones and its first rejected one
(:func:`~trtspec.decoding.types.tested_positions`). It does not depend on
``k``: a draft whose every position is accepted with probability ``a`` shows
``1 - a`` at any ``k`` (the demo pair: ~5%), so a controller that chooses ``k``
(goodput, up to ``k_max``) moves the first rate and not this one.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from trtspec.control.clock import Clock
from trtspec.decoding.types import tested_positions


def rejection_rate(drafted: int, accepted: int) -> float | None:
    """``1 - accepted / drafted``; ``None`` when ``drafted == 0``."""
    assert 0 <= accepted <= drafted, f"accepted={accepted} must be in [0, drafted={drafted}]"
    return (drafted - accepted) / drafted if drafted else None  # == 1 - accepted / drafted, exactly


@dataclass(frozen=True)
class _Event:
    t: float
    drafted: int
    accepted: int
    tested: int


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
        self._tested = 0

    def observe(self, drafted: int, accepted: int) -> None:
        """Add one iteration (``drafted == 0`` iterations are ignored)."""
        assert 0 <= accepted <= drafted
        if drafted == 0:
            return
        tested = tested_positions(drafted, accepted)
        self._events.append(_Event(self._clock(), drafted, accepted, tested))
        self._drafted += drafted
        self._accepted += accepted
        self._tested += tested
        self._trim()

    def clear(self) -> None:
        self._events.clear()
        self._drafted = self._accepted = self._tested = 0

    def _drop_oldest(self) -> None:
        e = self._events.popleft()
        self._drafted -= e.drafted
        self._accepted -= e.accepted
        self._tested -= e.tested

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

    @property
    def tested(self) -> int:
        """Draft positions tested in the window (see the module docstring)."""
        self._trim()
        return self._tested

    def rate(self) -> float | None:
        """The rejection rate over the window (see the module docstring)."""
        self._trim()
        return rejection_rate(self._drafted, self._accepted)

    def position_rate(self) -> float | None:
        """The rejection rate per tested position over the window (see the module docstring)."""
        self._trim()
        return rejection_rate(self._tested, self._accepted)


def take_share(credit: float, share: float) -> tuple[float, bool]:
    """One call of a deterministic accumulator that says yes to a ``share`` of the calls: the new
    credit, and whether this call is one of them (with share 0.1: the 10th, 20th, ... call)."""
    credit += share
    if credit >= 1.0 - 1e-9:  # 0.1 added ten times is 0.9999999999999999: the 10th call, not the 11th
        return credit - 1.0, True
    return credit, False
