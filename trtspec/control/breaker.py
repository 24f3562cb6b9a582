"""Two-level circuit breaker over the rolling rejection rate per tested position of the draft model's drafts.

It guards the draft model (a wrong model draft costs ``k`` draft steps and a verify
pass): the governor feeds it the iterations the model drafted (and failed or late
model calls as all rejected), not those of the free drafters (``ngram``, ``suffix``),
whose wrong drafts cost only their rows in the target's pass and whose normal
rejection rate (30-60%) would open it. Its state bars the model, not them.

The rate is per tested position (:mod:`trtspec.control.rates`), which does not depend on
``k``. Until stop 26 it was over drafted tokens, which grows with ``k``: a healthy draft
crossed the 20% threshold by drafting long (the demo pair at ``k = 8``: ~20-23% of drafted
tokens rejected, ~5% of tested positions), and SOFT halved ``k_max`` where long drafts
paid most. The window and ``min_tokens`` still count drafted tokens: a draft that is wrong
from its first token shows ``k`` of them per iteration, so it is found as soon as before.

States and what they allow the draft model::

    CLOSED     every admitted request speculates, k up to k_max
    SOFT       the draft gets lower priority: k_max halved, a lower cap on
               concurrently speculating requests (admission.soft_max_speculating)
    OPEN       hard: no request speculates
    HALF_OPEN  after the cool-down: a half_open_fraction share of new requests
               (probes) speculate, to measure

Transitions (rate = rejection rate per tested position over the window;
no rate-driven transition before the window holds ``min_tokens`` drafted tokens)::

    CLOSED    -> SOFT       rate > soft_threshold (20%)
    CLOSED    -> OPEN       rate > hard_threshold (30%)
    SOFT      -> OPEN       rate > hard_threshold
    SOFT      -> CLOSED     rate < soft_threshold - recover_margin, after min_dwell_s in SOFT
    OPEN      -> HALF_OPEN  cooldown_s after opening (the window is cleared)
    HALF_OPEN -> CLOSED     once probes drafted half_open_min_tokens: rate < soft_threshold
    HALF_OPEN -> SOFT       ... soft_threshold <= rate <= hard_threshold
    HALF_OPEN -> OPEN       ... rate > hard_threshold (the cool-down starts again)

The window spans the last ``window_s`` seconds and at most ``window_tokens``
drafted tokens. Every transition is logged and sent to the listeners (after
the breaker's lock is released; a failing listener is logged, never raised).
"""

from __future__ import annotations

import enum
import logging
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

from trtspec.control.clock import Clock
from trtspec.control.config import BreakerConfig
from trtspec.control.rates import RollingRejection, take_share

log = logging.getLogger("trtspec.control.breaker")


class BreakerState(str, enum.Enum):
    CLOSED = "closed"
    SOFT = "soft"
    OPEN = "open"
    HALF_OPEN = "half_open"


class BreakerListener(Protocol):
    """Told of every breaker transition (the metrics layer implements this)."""

    def on_transition(self, old: BreakerState, new: BreakerState, reason: str, rate: float | None) -> None: ...


@dataclass(frozen=True)
class Transition:
    at: float  # clock time
    old: BreakerState
    new: BreakerState
    reason: str  # soft_threshold_exceeded | hard_threshold_exceeded | recovered | cooldown_elapsed | probe_*
    rate: float | None  # the rejection rate that caused it (None for time-driven transitions)


@dataclass(frozen=True)
class BreakerSnapshot:
    state: BreakerState
    rejection_rate: float | None  # per tested position
    window_drafted: int
    window_tested: int
    window_accepted: int
    since: float  # clock time of the last transition

    def to_dict(self) -> dict:
        return {
            "state": self.state.value,
            "rejection_rate": self.rejection_rate,
            "window_drafted": self.window_drafted,
            "window_tested": self.window_tested,
            "window_accepted": self.window_accepted,
            "since": self.since,
        }


class CircuitBreaker:
    """Shared by all requests that draft with the model; every method is safe to call from any thread."""

    def __init__(self, config: BreakerConfig, clock: Clock, listeners: Iterable[BreakerListener] = ()) -> None:
        self.config = config
        self._clock = clock
        self._listeners = list(listeners)
        self._lock = threading.Lock()
        self._window = RollingRejection(clock, window_s=config.window_s, window_tokens=config.window_tokens)
        self._state = BreakerState.CLOSED
        self._since = clock()
        self._probe_credit = 0.0
        self.transitions: list[Transition] = []  # the most recent ones (bounded)

    def add_listener(self, listener: BreakerListener) -> None:
        with self._lock:
            self._listeners.append(listener)

    # -- reading ---------------------------------------------------------------

    @property
    def state(self) -> BreakerState:
        fired: list[Transition] = []
        with self._lock:
            self._update(fired)
            state = self._state
        self._notify(fired)
        return state

    def snapshot(self) -> BreakerSnapshot:
        fired: list[Transition] = []
        with self._lock:
            self._update(fired)
            w = self._window
            snap = BreakerSnapshot(self._state, w.position_rate(), w.drafted, w.tested, w.accepted, self._since)
        self._notify(fired)
        return snap

    def admit(self, force: bool = False) -> tuple[BreakerState, bool]:
        """For a new request: ``(state, may_speculate)``. In HALF_OPEN only a
        ``half_open_fraction`` share of calls (and every ``force`` call) are
        let through, as probes; in OPEN none."""
        fired: list[Transition] = []
        with self._lock:
            self._update(fired)
            state = self._state
            if state is BreakerState.OPEN:
                allowed = False
            elif state is BreakerState.HALF_OPEN:
                allowed = force
                if not force:
                    self._probe_credit, allowed = take_share(self._probe_credit, self.config.half_open_fraction)
            else:
                allowed = True
        self._notify(fired)
        return state, allowed

    # -- learning --------------------------------------------------------------

    def observe(self, drafted: int, accepted: int) -> None:
        """Add one iteration of any request (``drafted == 0``: nothing to learn).
        A disabled breaker (``enabled: false``) still measures the rolling rejection
        rate (for the metrics) but never leaves CLOSED."""
        if drafted == 0:
            return
        if not self.config.enabled:
            with self._lock:
                self._window.observe(drafted, accepted)
            return
        fired: list[Transition] = []
        with self._lock:
            self._update(fired)  # a due time-driven transition first, so it cannot clear this iteration
            self._window.observe(drafted, accepted)
            self._update(fired)
        self._notify(fired)

    # -- the state machine (caller holds the lock) ---------------------------------

    def _move(self, new: BreakerState, reason: str, rate: float | None, fired: list[Transition]) -> None:
        t = Transition(self._clock(), self._state, new, reason, rate)
        self._state = new
        self._since = t.at
        self.transitions.append(t)
        del self.transitions[:-100]
        fired.append(t)

    def _update(self, fired: list[Transition]) -> None:
        cfg, now = self.config, self._clock()
        if not cfg.enabled:
            return
        if self._state is BreakerState.OPEN:
            if now - self._since >= cfg.cooldown_s:
                self._window.clear()
                self._probe_credit = 0.0
                self._move(BreakerState.HALF_OPEN, "cooldown_elapsed", None, fired)
            return
        rate = self._window.position_rate()
        if rate is None:
            return
        if self._state is BreakerState.HALF_OPEN:
            if self._window.drafted < cfg.half_open_min_tokens:
                return
            if rate > cfg.hard_threshold:
                self._move(BreakerState.OPEN, "probe_hard_threshold_exceeded", rate, fired)
            elif rate < cfg.soft_threshold:
                self._move(BreakerState.CLOSED, "probe_recovered", rate, fired)
            else:
                self._move(BreakerState.SOFT, "probe_soft_threshold_exceeded", rate, fired)
            return
        if self._window.drafted < cfg.min_tokens:
            return
        if rate > cfg.hard_threshold:
            self._move(BreakerState.OPEN, "hard_threshold_exceeded", rate, fired)
        elif self._state is BreakerState.CLOSED and rate > cfg.soft_threshold:
            self._move(BreakerState.SOFT, "soft_threshold_exceeded", rate, fired)
        elif (
            self._state is BreakerState.SOFT
            and rate < cfg.soft_threshold - cfg.recover_margin
            and now - self._since >= cfg.min_dwell_s
        ):
            self._move(BreakerState.CLOSED, "recovered", rate, fired)

    def _notify(self, fired: list[Transition]) -> None:
        for t in fired:
            rate = "n/a" if t.rate is None else f"{t.rate:.1%}"
            level = logging.WARNING if t.new in (BreakerState.OPEN, BreakerState.SOFT) else logging.INFO
            log.log(level, "breaker %s -> %s (%s, rejection rate %s)", t.old.value, t.new.value, t.reason, rate)
            with self._lock:
                listeners = list(self._listeners)
            for listener in listeners:
                try:
                    listener.on_transition(t.old, t.new, t.reason, t.rate)
                except Exception:  # a broken metrics sink must never take the service down
                    log.exception("breaker listener %r failed", listener)
