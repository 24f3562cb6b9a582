"""Self-recovery of a served model: one small state machine per model, the clock injected.

Triton does not restart a Python-backend stub that dies: requests to it fail
("Stub process ... is not healthy") while ``/v2/models/<m>/ready`` still says
200 (docs/reliability.md, "Why we need our own supervisor"). Recovery is ours: notice, reload through the repository API
(explicit model-control mode), probe, resume. :class:`ModelSupervisor` is the
decision part, free of Triton and threads; ``spec_decode`` drives one per
model (``draft``, ``target``) from a :class:`SupervisorThread`, with the reload
(``pb_utils.load_model``) and the probe (a real BLS forward) passed in.

States::

    HEALTHY    the model answers; the request path uses it
    SUSPECT    a call failed (or kept missing its deadline); a probe, no reload, decides
    FAILED     down; a recovery attempt is due at ``next_attempt_at``
    RELOADING  the reload runs
    PROBING    reloaded; a warm-up probe decides

Transitions (``report_error`` is the request path's; the rest is :meth:`ModelSupervisor.step`)::

    HEALTHY   -> SUSPECT    report_error(): a call failed
    SUSPECT   -> HEALTHY    report_ok(): a call answered (it is alive: no probe needed)
    HEALTHY   -> FAILED     report_error(fatal=True): the stub is known dead ("... is not healthy"),
                            or a liveness probe failed (one runs after ``health_interval_s`` without an answer)
    SUSPECT   -> FAILED     report_error(fatal=True) (a probe in progress is abandoned)
    SUSPECT   -> HEALTHY    the probe answered (a transient error: no reload)
    SUSPECT   -> FAILED     the probe failed; the first reload is due at once
    FAILED    -> RELOADING  the backoff elapsed
    RELOADING -> PROBING    the reload returned
    RELOADING -> FAILED     the reload failed; the next attempt backs off
    PROBING   -> HEALTHY    the probe answered; the backoff is reset
    PROBING   -> FAILED     the probe failed; the next attempt backs off

Busy is not dead: ``busy()`` (injected; ``spec_decode`` passes the guard's) is true
while the model has calls in flight that are still within their work-scaled
bounds. Then no probe is sent (it would only queue behind them: a single
instance serves one call at a time) -- a HEALTHY model's liveness check is
those calls, a SUSPECT one waits for one of them to answer -- and a FAILED
model is not reloaded unless Triton said its stub is dead. A call that runs
past its bound no longer counts, so a hung model is still probed and reloaded.
A probe sent while the model was idle can still queue behind a call made just
after it; if it fails while such calls progress, it gives no verdict (counted
in ``probes_inconclusive``) and the state stays as it was.

Backoff: attempt ``n`` of a recovery (``n = 0`` right after detection) waits
``0`` for ``n = 0``, else ``min(backoff_max_s, backoff_initial_s * backoff_factor ** (n - 1))``.
Without a reload action (a server not in explicit model-control mode), a
FAILED model is re-probed on the same schedule instead, so it comes back when
someone else reloads it.

An error from a call made before the model last came back (``started_at``
earlier than that) is ignored: calls abandoned on a dead stub fail long after
it was replaced, and must not condemn the new one.

Every transition is sent to the listeners (outside the lock; a failing
listener is logged, never raised). Safe to call from any thread.
"""

from __future__ import annotations

import enum
import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from trtspec.errors import one_line

log = logging.getLogger("trtspec.serving.supervisor")

Clock = Callable[[], float]


class Health(str, enum.Enum):
    HEALTHY = "healthy"
    SUSPECT = "suspect"
    FAILED = "failed"
    RELOADING = "reloading"
    PROBING = "probing"


class Action(str, enum.Enum):
    PROBE = "probe"
    RELOAD = "reload"


HealthListener = Callable[[str, Health, Health, str], None]  # (model, old, new, reason)

BUSY_RECHECK_S = 0.25  # while the model is busy, ask again this soon whether a probe or reload is due


def _never_busy() -> bool:
    return False


@dataclass(frozen=True)
class SupervisorConfig:
    backoff_initial_s: float = 1.0  # wait before the 2nd recovery attempt (the 1st is immediate)
    backoff_factor: float = 2.0
    backoff_max_s: float = 60.0
    health_interval_s: float = 5.0  # probe a HEALTHY model that answered nothing for this long; 0: never

    def __post_init__(self) -> None:
        if self.backoff_initial_s < 0 or self.backoff_max_s < self.backoff_initial_s:
            raise ValueError("supervisor: need 0 <= backoff_initial_s <= backoff_max_s")
        if self.backoff_factor < 1:
            raise ValueError(f"supervisor: backoff_factor must be >= 1, got {self.backoff_factor}")
        if self.health_interval_s < 0:
            raise ValueError(f"supervisor: health_interval_s must be >= 0, got {self.health_interval_s}")

    def backoff_s(self, attempt: int) -> float:
        """Wait before recovery attempt ``attempt`` (0: the first, right after detection)."""
        if attempt <= 0:
            return 0.0
        return min(self.backoff_max_s, self.backoff_initial_s * self.backoff_factor ** (attempt - 1))


@dataclass(frozen=True)
class Outage:
    """One episode that reached FAILED: from the first error to HEALTHY again."""

    cause: str
    started_at: float
    recovered_at: float | None
    reloads: int  # reload attempts during it

    @property
    def downtime_s(self) -> float | None:
        return None if self.recovered_at is None else self.recovered_at - self.started_at

    def to_dict(self) -> dict:
        return {"cause": self.cause, "downtime_s": self.downtime_s, "reloads": self.reloads}


class ModelSupervisor:
    """One model's health: see the module docstring."""

    def __init__(
        self,
        name: str,
        config: SupervisorConfig = SupervisorConfig(),
        clock: Clock = time.monotonic,
        *,
        can_reload: bool = True,
        listeners: Iterable[HealthListener] = (),
        busy: Callable[[], bool] = _never_busy,
    ) -> None:
        self.name = name
        self._busy = busy
        self.config = config
        self.can_reload = can_reload
        self._clock = clock
        self._lock = threading.Lock()
        self._listeners = list(listeners)
        now = clock()
        self._state = Health.HEALTHY
        self._since = now
        self._last_ok = now
        self._attempt = 0  # failed recovery attempts in the current outage
        self._next_attempt_at = now
        self._down_since: float | None = None  # first error of the current episode
        self._recovered_at = -math.inf  # last time it became HEALTHY again
        self._cause = ""
        self._episode_reloads = 0
        self._fatal = False  # the current FAILED came from Triton saying the stub is dead
        self._probe_began: float | None = None  # a probe is running since then
        self.last_probe: dict | None = None  # {"ok", "seconds", "at"} of the last probe
        self.last_error = ""
        self.errors_reported = 0
        self.reloads = 0  # reloads that returned
        self.reload_failures = 0
        self.probe_failures = 0
        self.probes_inconclusive = 0  # failed probes that had queued behind calls still in progress
        self.outages: deque[Outage] = deque(maxlen=20)

    def add_listener(self, listener: HealthListener) -> None:
        with self._lock:
            self._listeners.append(listener)

    # -- reading -------------------------------------------------------------------

    @property
    def state(self) -> Health:
        return self._state

    @property
    def healthy(self) -> bool:
        return self._state is Health.HEALTHY

    def due(self) -> tuple[Action | None, float]:
        """The action due now, else ``(None, seconds until one may be due)`` (``inf``: none planned)."""
        with self._lock:
            return self._due(self._clock())

    def _due(self, now: float) -> tuple[Action | None, float]:
        s = self._state
        if s is Health.PROBING:
            return Action.PROBE, 0.0
        if s is Health.SUSPECT:
            return (None, BUSY_RECHECK_S) if self._busy() else (Action.PROBE, 0.0)
        if s is Health.FAILED:
            wait = self._next_attempt_at - now
            if wait > 0:
                return None, wait
            if not self._fatal and self._busy():  # calls in flight still progress: no reload under them
                return None, BUSY_RECHECK_S
            return (Action.RELOAD if self.can_reload else Action.PROBE), 0.0
        if s is Health.HEALTHY and self.config.health_interval_s > 0:
            wait = self._last_ok + self.config.health_interval_s - now
            if wait > 0:
                return None, wait
            return (None, BUSY_RECHECK_S) if self._busy() else (Action.PROBE, 0.0)
        return None, math.inf

    def snapshot(self) -> dict:
        with self._lock:
            now = self._clock()
            action, wait = self._due(now)
            last = self.outages[-1] if self.outages else None
            return {
                "model": self.name,
                "state": self._state.value,
                "healthy": self._state is Health.HEALTHY,
                "for_s": now - self._since,
                "last_error": self.last_error,
                "errors_reported": self.errors_reported,
                "failed_attempts": self._attempt,
                "next_attempt_in_s": (0.0 if action is not None else wait)
                if self._state is Health.FAILED
                else None,
                "reloads": self.reloads,
                "reload_failures": self.reload_failures,
                "probe_failures": self.probe_failures,
                "probes_inconclusive": self.probes_inconclusive,
                "last_answer_age_s": now - self._last_ok,
                "busy": self._busy(),
                "probe": self._probe_status(now, action),
                "outages": len(self.outages),
                "last_outage": last.to_dict() if last is not None else None,
            }

    def _probe_status(self, now: float, due: Action | None) -> dict:
        """What the probing does now: ``running``, ``due``, ``waiting`` (busy: its calls in flight are
        the check) or ``idle``; with the last probe's outcome."""
        if self._probe_began is not None:
            state = "running"
        elif due is Action.PROBE:
            state = "due"
        elif self._state in (Health.HEALTHY, Health.SUSPECT) and self._busy():
            state = "waiting"
        else:
            state = "idle"
        last = self.last_probe
        return {
            "state": state,
            "running_for_s": None if self._probe_began is None else now - self._probe_began,
            "last_ok": None if last is None else last["ok"],
            "last_seconds": None if last is None else last["seconds"],
            "last_age_s": None if last is None else now - last["at"],
        }

    # -- the request path ------------------------------------------------------------

    def report_ok(self) -> None:
        """A call answered (cheap: called on every successful call). A SUSPECT model is HEALTHY again."""
        self._last_ok = self._clock()
        if self._state is not Health.SUSPECT:
            return
        fired: list[tuple[Health, Health, str]] = []
        with self._lock:
            if self._state is Health.SUSPECT:
                self._recovered_at = self._last_ok
                self._move(Health.HEALTHY, "a call answered", fired)
        self._notify(fired)

    def report_error(self, reason: str, *, fatal: bool = False, started_at: float | None = None) -> bool:
        """A call failed; True when this changed the state (a probe or a reload is due).

        ``fatal``: the model is known dead (no probe needed: FAILED, reload at once).
        ``started_at``: when the failed call was made (clock time); a call older than
        the model's last recovery is ignored.
        """
        fired: list[tuple[Health, Health, str]] = []
        with self._lock:
            if started_at is not None and started_at < self._recovered_at:
                return False  # a call to the instance we already replaced
            self.errors_reported += 1
            self.last_error = reason
            if self._state is Health.HEALTHY:
                self._down_since = self._clock()
                self._cause = reason
                self._episode_reloads = 0
                self._move(Health.FAILED if fatal else Health.SUSPECT, reason, fired)
                if fatal:
                    self._attempt = 0
                    self._next_attempt_at = self._clock()
                    self._fatal = True
            elif self._state is Health.SUSPECT and fatal:
                self._fail(reason, fired)
                self._fatal = True
        self._notify(fired)
        return bool(fired)

    def abandoned(self) -> bool:
        """True when a probe in progress no longer matters (the model was declared FAILED meanwhile)."""
        return self._state is Health.FAILED

    # -- the supervisor's own work ------------------------------------------------------

    def step(self, reload: Callable[[], None] | None, probe: Callable[[], None], max_actions: int = 4) -> float:
        """Run the actions due now (a reload is followed by its probe at once);
        seconds until the next may be due. ``reload``/``probe`` raise on failure."""
        for _ in range(max_actions):
            action, wait = self.due()
            if action is None:
                return wait
            if action is Action.RELOAD:
                assert reload is not None, "a supervisor that can reload needs a reload action"
                self._begin(Health.RELOADING, "reload")
                try:
                    reload()
                except Exception as e:
                    self._reload_failed(one_line(e))
                else:
                    self._reloaded()
            else:
                began = self._state
                self._probe_began = self._clock()
                try:
                    probe()
                except Exception as e:
                    self._probe_done(False, one_line(e), began)
                else:
                    self._probe_done(True, "", began)
        return 0.0

    def _begin(self, state: Health, reason: str) -> None:
        fired: list[tuple[Health, Health, str]] = []
        with self._lock:
            self._move(state, reason, fired)
            if state is Health.RELOADING:
                self._episode_reloads += 1
        self._notify(fired)

    def _reload_failed(self, error: str) -> None:
        fired: list[tuple[Health, Health, str]] = []
        with self._lock:
            self.reload_failures += 1
            self.last_error = f"reload failed: {error}"
            self._fail(self.last_error, fired)
        self._notify(fired)

    def _reloaded(self) -> None:
        fired: list[tuple[Health, Health, str]] = []
        with self._lock:
            self.reloads += 1
            self._move(Health.PROBING, "reloaded", fired)
        self._notify(fired)

    def _probe_done(self, ok: bool, error: str, began: Health) -> None:
        fired: list[tuple[Health, Health, str]] = []
        with self._lock:
            now = self._clock()
            if self._probe_began is not None:
                self.last_probe = {"ok": ok, "seconds": now - self._probe_began, "at": now}
            self._probe_began = None
            if ok:
                self._last_ok = now
                if self._state is not Health.HEALTHY:
                    if self._state is not Health.SUSPECT and self._down_since is not None:
                        self.outages.append(Outage(self._cause, self._down_since, now, self._episode_reloads))
                    self._attempt = 0
                    self._down_since = None
                    self._recovered_at = now
                    self._move(Health.HEALTHY, "probe answered", fired)
            elif self._state is Health.FAILED and began is not Health.FAILED:
                return  # declared dead while the probe ran (report_error(fatal=True)): nothing to add
            elif began in (Health.HEALTHY, Health.SUSPECT) and self._busy():
                # Sent while the model was idle, it queued behind calls made just after it, which still
                # progress: no verdict. They are the liveness check; the next probe waits until they end.
                self.probes_inconclusive += 1
            else:
                self.probe_failures += 1
                self.last_error = f"probe failed: {error}"
                if self._state is Health.HEALTHY:  # a liveness probe: the episode starts now
                    self._down_since = now
                    self._cause = self.last_error
                    self._episode_reloads = 0
                self._fail(self.last_error, fired)
        self._notify(fired)

    def _fail(self, reason: str, fired: list) -> None:
        """Into FAILED (caller holds the lock). From HEALTHY/SUSPECT the first attempt is
        immediate; every later failure backs off."""
        now = self._clock()
        self._fatal = False
        if self._state in (Health.HEALTHY, Health.SUSPECT):
            self._attempt = 0
        else:
            self._attempt += 1
        self._next_attempt_at = now + self.config.backoff_s(self._attempt)
        self._move(Health.FAILED, reason, fired)

    def _move(self, new: Health, reason: str, fired: list) -> None:
        old = self._state
        self._state = new
        self._since = self._clock()
        if old is not new or new is Health.FAILED:
            fired.append((old, new, reason))

    def _notify(self, fired: list[tuple[Health, Health, str]]) -> None:
        if not fired:
            return
        with self._lock:
            listeners = list(self._listeners)
        for old, new, reason in fired:
            level = logging.WARNING if new in (Health.FAILED, Health.SUSPECT) else logging.INFO
            log.log(level, "model %r: %s -> %s (%s)", self.name, old.value, new.value, reason)
            for listener in listeners:
                try:
                    listener(self.name, old, new, reason)
                except Exception:
                    log.exception("health listener %r failed", listener)


class SupervisorThread:
    """Runs :meth:`ModelSupervisor.step` on a daemon thread; :meth:`wake` when something changed.

    Waits between steps for what ``step`` says (at most ``max_wait_s``) or
    until woken; a failing step is logged and retried after ``max_wait_s``.
    """

    def __init__(
        self,
        supervisor: ModelSupervisor,
        reload: Callable[[], None] | None,
        probe: Callable[[], None],
        *,
        max_wait_s: float = 1.0,
        on_error: Callable[[str], None] | None = None,
    ) -> None:
        self.supervisor = supervisor
        self._reload = reload
        self._probe = probe
        self._max_wait_s = max_wait_s
        self._on_error = on_error
        self._wake = threading.Event()
        self._stop = False
        self._thread = threading.Thread(target=self._run, name=f"trtspec-supervisor-{supervisor.name}", daemon=True)
        supervisor.add_listener(lambda *_: self.wake())

    def start(self) -> SupervisorThread:
        self._thread.start()
        return self

    def wake(self) -> None:
        self._wake.set()

    def stop(self, timeout_s: float = 2.0) -> None:
        """Ask the thread to end and wait up to ``timeout_s`` (a reload in progress cannot be interrupted)."""
        self._stop = True
        self._wake.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout_s)

    def _run(self) -> None:
        while not self._stop:
            try:
                wait = self.supervisor.step(self._reload, self._probe)
            except Exception as e:  # a bug here must not end supervision
                log.exception("supervisor of %r failed", self.supervisor.name)
                if self._on_error is not None:
                    self._on_error(f"supervisor of {self.supervisor.name!r} failed: {one_line(e)}")
                wait = self._max_wait_s
            if self._stop:
                return
            self._wake.wait(max(0.0, min(wait, self._max_wait_s)))
            self._wake.clear()
