"""The clock the control plane reads; injected everywhere, faked in tests."""

from __future__ import annotations

from collections.abc import Callable

Clock = Callable[[], float]  # seconds, monotonic (time.monotonic in production)


class FakeClock:
    """A clock that moves only when told to. ``sleep`` advances it (for fault injection in tests)."""

    def __init__(self, start: float = 0.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        assert seconds >= 0, "time does not go backwards"
        self.now += seconds

    def sleep(self, seconds: float) -> None:
        self.advance(seconds)
