"""What keeps a failing draft (or target) from becoming an outage, inside ``spec_decode``.

:class:`DeploymentHealth` owns, for one ``spec_decode`` instance:

- the BLS call pools (one per model) and the guarded models (:mod:`trtspec.serving.guard`): every
  draft call has a deadline from :class:`~trtspec.serving.deadline.AdaptiveDeadline`,
  every target call one that grows with the work asked
  (:class:`~trtspec.serving.deadline.WorkDeadline`: ``target_timeout_s + timeout_per_token_s x``
  the tokens of the pass and of the calls queued ahead), which also bounds how long a late draft
  call still counts as progress; a long target pass is fed in chunks of ``prefill_chunk_tokens``;
- one :class:`~trtspec.serving.supervisor.ModelSupervisor` per model, driven by a
  :class:`~trtspec.serving.supervisor.SupervisorThread` whose reload is an unload then a load
  through Triton's repository API (see :meth:`DeploymentHealth._reload`) and whose probe is a real forward
  through BLS (a two-token sequence, then its release), bounded by ``probe_timeout_s``, never
  sent while the model's calls in flight still progress (they are the check; the probe would
  queue behind them) nor while Triton says the model is loading;
- the status file (``<TRTSPEC_STATUS_DIR>/<model>.json``, every second).

What each signal does:

=====================  ==========================================================================
draft call failed      (BLS error: stub dead, model error) the loop goes on with the target alone;
                       the breaker's window gets ``k`` drafted / 0 accepted; the draft supervisor
                       goes SUSPECT (FAILED, reload at once, when Triton says the stub is dead),
                       which marks the draft unavailable at once (``governor.
                       set_draft_available(False)``: new requests run target-only, reason
                       ``draft_unavailable``) until a probe (or reload + probe) says it answers
draft call late        the proposal is dropped, the loop goes on with the target alone and
                       restarts the draft in a fresh session, which the request uses again after
                       the fallback's cool-down (its third late call drops it); the breaker's
                       window gets ``k`` drafted / 0 accepted (so persistent lateness opens it);
                       ``draft_late_strikes`` late calls in a row make the supervisor probe the
                       draft (with the generous ``probe_timeout_s``)
target call failed     the request fails ``UNAVAILABLE``; the target supervisor goes SUSPECT;
or late                while the target is not HEALTHY new requests fail fast with ``UNAVAILABLE``
=====================  ==========================================================================

The breaker's rolling rejection rate thus counts a late or failed draft as
a fully rejected one (a proposal that never arrives is worth what a wrong one
is); the exported counters ``trtspec_drafted_tokens_total`` /
``trtspec_accepted_tokens_total`` count only proposals that arrived, so the
PromQL rejection rate keeps its definition. Late and failed drafts are
counted in ``trtspec_fallbacks_total{reason="draft_error"}`` (the loop's
``draft_errors``) and, separately, in the status file.
"""

from __future__ import annotations

import json
import os
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from typing import Any

from trtspec.control.breaker import BreakerState
from trtspec.control.governor import SpeculationGovernor
from trtspec.decoding.types import DrafterKind
from trtspec.errors import one_line
from trtspec.serving import statusfile
from trtspec.serving.deadline import AdaptiveDeadline, Work, WorkDeadline
from trtspec.serving.guard import GuardedModel
from trtspec.serving.launcher import TRITON_URL_ENV
from trtspec.serving.supervisor import Health, ModelSupervisor, SupervisorConfig, SupervisorThread
from trtspec.serving.triton.bls import BLSError, BLSTimeout, RemoteModel, StubDeadError
from trtspec.wire import SpecDecodeParams


UNLOAD_WAIT_S = 10.0  # at most this long for an unload to finish before the load
LOAD_TIMEOUT_S = 600.0  # a load (a fresh stub: import torch, load the checkpoint, warm up)


@dataclass(frozen=True)
class HealthConfig:
    supervise: bool = True
    draft_timeout_s: float = 0.0  # > 0: a fixed per-call deadline; 0: adaptive
    draft_timeout_floor_s: float = 0.05
    draft_timeout_max_s: float = 2.0
    draft_timeout_multiplier: float = 4.0
    draft_late_strikes: int = 3
    target_timeout_s: float = 30.0  # a one-token call's bound; 0: none
    timeout_per_token_s: float = 0.05  # added per token of the pass and of the calls queued ahead
    prefill_chunk_tokens: int = 512  # a longer target pass is fed in calls of this many; 0: one call
    probe_timeout_s: float = 30.0
    supervisor: SupervisorConfig = field(default_factory=SupervisorConfig)
    status_interval_s: float = 1.0
    default_drafter: DrafterKind = DrafterKind.MODEL  # what the status's ``speculation`` speaks of

    @classmethod
    def from_params(cls, p: SpecDecodeParams) -> HealthConfig:
        """The reliability knobs of ``spec_decode``'s parameters."""
        return cls(
            supervise=p.supervise,
            draft_timeout_s=p.draft_timeout_s,
            draft_timeout_floor_s=p.draft_timeout_floor_s,
            draft_timeout_max_s=p.draft_timeout_max_s,
            draft_timeout_multiplier=p.draft_timeout_multiplier,
            draft_late_strikes=p.draft_late_strikes,
            target_timeout_s=p.target_timeout_s,
            timeout_per_token_s=p.timeout_per_token_s,
            prefill_chunk_tokens=p.prefill_chunk_tokens,
            probe_timeout_s=p.probe_timeout_s,
            default_drafter=DrafterKind(p.default_drafter),
            supervisor=SupervisorConfig(
                backoff_initial_s=p.reload_backoff_initial_s,
                backoff_max_s=p.reload_backoff_max_s,
                health_interval_s=p.health_interval_s,
            ),
        )


class DeploymentHealth:
    """See the module docstring. ``start()`` after the models are built, ``stop()`` in ``finalize``."""

    def __init__(
        self,
        pb: Any,
        config: HealthConfig,
        governor: SpeculationGovernor,
        *,
        model_name: str,
        pool_size: int,
        extra_status: Callable[[], dict] | None = None,
    ) -> None:
        self.pb = pb
        self.config = config
        self.governor = governor
        self.model_name = model_name
        # One pool per model, so calls left hanging on one model never hold up the other's.
        self._pool_size = pool_size
        self._pools: list[ThreadPoolExecutor] = []
        self.draft_deadline = AdaptiveDeadline(
            fixed_s=config.draft_timeout_s,
            floor_s=config.draft_timeout_floor_s,
            max_s=config.draft_timeout_max_s,
            multiplier=config.draft_timeout_multiplier,
        )
        self.draft: ModelSupervisor | None = None
        self.target: ModelSupervisor | None = None
        self._guards: dict[str, GuardedModel] = {}  # by supervisor name
        self.draft_errors = 0
        self._late_streak = 0
        self._threads: list[SupervisorThread] = []
        self._extra_status = extra_status
        self._status_path = statusfile.status_path(model_name)
        self._stop = threading.Event()
        self._status_thread: threading.Thread | None = None

    # -- building ----------------------------------------------------------------------

    def _pool(self, name: str) -> ThreadPoolExecutor:
        pool = ThreadPoolExecutor(max_workers=self._pool_size, thread_name_prefix=f"{self.model_name}-{name}")
        self._pools.append(pool)
        return pool

    def work_deadline(self) -> WorkDeadline | None:
        """A call's bound, by the work it asks (None: ``target_timeout_s`` 0, no bound)."""
        c = self.config
        return WorkDeadline(c.target_timeout_s, c.timeout_per_token_s) if c.target_timeout_s > 0 else None

    def guard_target(self, bls: RemoteModel, prefill_chunk: int | None = None) -> GuardedModel:
        """The target behind its deadline; ``prefill_chunk`` (default ``prefill_chunk_tokens``; 0 for a
        model that cannot be fed without logits) splits long passes."""
        pool = self._pool(bls.model_name)
        self.target = self._supervisor(bls, pool)
        limit = self.work_deadline()
        guard = GuardedModel(
            bls,
            pool,
            limit or (lambda work: None),
            _TargetHooks(self.target),
            late_error=lambda s: BLSTimeout(f"model '{bls.model_name}' did not answer within {s:g}s"),
            prefill_chunk=self.config.prefill_chunk_tokens if prefill_chunk is None else prefill_chunk,
        )
        self._guards[bls.model_name] = guard
        return guard

    def guard_draft(self, bls: RemoteModel) -> GuardedModel:
        pool = self._pool(bls.model_name)
        self.draft = self._supervisor(bls, pool)
        if self.config.supervise:
            self.draft.add_listener(self._draft_changed)
        limit = self.work_deadline()
        guard = GuardedModel(
            bls,
            pool,
            self.draft_deadline.deadline_s,
            _DraftHooks(self),
            late_error=lambda s: BLSTimeout(f"model '{bls.model_name}' missed its deadline of {s * 1000:.0f} ms"),
            close_async=True,
            stuck_after=limit or (lambda work: float("inf")),
        )
        self._guards[bls.model_name] = guard
        return guard

    def _supervisor(self, bls: RemoteModel, pool: ThreadPoolExecutor) -> ModelSupervisor:
        reload = self._reload(bls.model_name)
        name = bls.model_name
        sup = ModelSupervisor(name, self.config.supervisor, time.monotonic, can_reload=reload is not None,
                              busy=lambda: name in self._guards and self._guards[name].busy())
        sup.add_listener(self._log_transition)
        if self.config.supervise:
            probe = self._probe(bls, pool, sup)
            self._threads.append(SupervisorThread(sup, reload, probe, on_error=self._log_error))
        return sup

    def _reload(self, name: str) -> Callable[[], None] | None:
        """Unload, wait until Triton no longer calls it ready (bounded), load; None when neither the
        server's HTTP endpoint (``TRTSPEC_TRITON_URL``, set by the launcher) nor ``pb_utils.load_model``
        is there.

        A plain load of an unchanged model is not enough on Triton 2.51: the server
        keeps the existing instance, dead stub and all, and reports success. Unloading first
        makes the load start a fresh stub. Through the HTTP repository API when the launcher told
        us where it is: ``pb_utils.load_model`` / ``unload_model`` hold up every BLS call of this
        stub while the load runs, the HTTP API does not (docs/reliability.md, "Why we need our own
        supervisor", has both measured).
        """
        url = os.environ.get(TRITON_URL_ENV, "").rstrip("/")
        if url:
            return lambda: _reload_over_http(url, name, self._stop)
        pb = self.pb
        load = getattr(pb, "load_model", None)
        if load is None:
            return None
        unload = getattr(pb, "unload_model", None)
        is_ready = getattr(pb, "is_model_ready", None)

        def reload() -> None:
            if unload is not None:
                unload(model_name=name)
                if is_ready is not None:
                    deadline = time.monotonic() + UNLOAD_WAIT_S
                    while is_ready(model_name=name) and time.monotonic() < deadline:
                        self._stop.wait(0.05)  # unloading is asynchronous: poll until it is done
            load(model_name=name)

        return reload

    def _probe(self, bls: RemoteModel, pool: ThreadPoolExecutor, sup: ModelSupervisor) -> Callable[[], None]:
        """The model's own probe (a real forward through BLS: ``bls.probe()``); bounded by ``probe_timeout_s``,
        and given up as soon as the model is declared dead meanwhile (a probe queued behind calls to a
        dead stub can take seconds to fail; the reload need not wait for it)."""
        timeout = self.config.probe_timeout_s
        url = os.environ.get(TRITON_URL_ENV, "").rstrip("/")

        def probe() -> None:
            if url:
                self._wait_while_loading(url, bls.model_name)
            future = pool.submit(bls.probe)
            deadline = time.monotonic() + timeout
            while True:
                try:
                    future.result(timeout=min(0.1, max(0.0, deadline - time.monotonic())))
                    return
                except FutureTimeout:
                    if sup.abandoned():
                        raise BLSError(f"model '{bls.model_name}' probe abandoned: declared dead meanwhile") from None
                    if time.monotonic() >= deadline:
                        future.cancel()
                        raise BLSTimeout(
                            f"model '{bls.model_name}' did not answer a probe within {timeout:g}s"
                        ) from None

        return probe

    def _wait_while_loading(self, url: str, name: str) -> None:
        """Return once Triton no longer says ``name`` is loading (at most ``LOAD_TIMEOUT_S``): a model
        being loaded -- by someone else's repository call, or still at start-up -- is not probed."""
        deadline = time.monotonic() + LOAD_TIMEOUT_S
        while _model_state(url, name) == "LOADING" and time.monotonic() < deadline and not self._stop.is_set():
            self._stop.wait(0.2)

    # -- running -----------------------------------------------------------------------

    def start(self) -> None:
        url = os.environ.get(TRITON_URL_ENV, "").rstrip("/")
        if url and self._threads:
            threading.Thread(target=self._supervise_when_ready, args=(url,), name="trtspec-supervise", daemon=True).start()
        else:
            for t in self._threads:
                t.start()
        if self._status_path is not None:
            self._status_thread = threading.Thread(target=self._status_loop, name="trtspec-status", daemon=True)
            self._status_thread.start()

    def _supervise_when_ready(self, url: str) -> None:
        """Start the supervisors once the server says it is ready. Until then Triton answers every
        call, probes included, with "Server not ready", and its HTTP endpoint (the reloads) is not up:
        supervising earlier condemned healthy models and kept refusing requests after startup
        (seen with a slow-loading target)."""
        while not self._stop.is_set() and not _server_ready(url):
            self._stop.wait(0.2)
        if not self._stop.is_set():
            for t in self._threads:
                t.start()

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.stop(timeout_s=1.0)
        if self._status_thread is not None:
            self._status_thread.join(2.0)
        for pool in self._pools:
            pool.shutdown(wait=False, cancel_futures=True)
        if self._status_path is not None:
            self._status_path.unlink(missing_ok=True)

    def target_refusal(self) -> str | None:
        """Why a new request must fail fast now (the target is known down), else None."""
        t = self.target
        if not self.config.supervise or t is None or t.healthy:
            return None
        return f"model '{t.name}' is unavailable ({t.state.value}: {t.last_error}); retry shortly"

    # -- listeners ---------------------------------------------------------------------

    def _draft_changed(self, name: str, old: Health, new: Health, reason: str) -> None:
        self.governor.set_draft_available(new is Health.HEALTHY)

    def _log_transition(self, name: str, old: Health, new: Health, reason: str) -> None:
        logger = self.pb.Logger
        text = f"trtspec {self.model_name}: model '{name}' {old.value} -> {new.value} ({reason})"
        (logger.log_info if new in (Health.HEALTHY, Health.PROBING, Health.RELOADING) else logger.log_warn)(text)

    def _log_error(self, message: str) -> None:
        self.pb.Logger.log_error(f"trtspec {self.model_name}: {message}")

    # -- status --------------------------------------------------------------------------

    def speculation(self) -> tuple[str, str]:
        """(``on`` | ``degraded`` | ``off``, why) for new requests that name no drafter right now
        (they draft with ``default_drafter``). The draft model's health and the breaker gate the
        model only: ``ngram``/``suffix`` speculate without either; ``auto`` goes on with them alone."""
        if self.governor.policy.rollout.mode.value == "off":
            return "off", "rollout mode off"
        drafter = self.config.default_drafter
        if drafter.free:
            return "on", f"drafter {drafter.value}: needs no draft model, not gated by the breaker"
        mode, why = self._model_speculation()
        if drafter is DrafterKind.AUTO and mode != "on":
            return ("on" if self.draft is None else "degraded"), f"{why}: auto drafts with ngram/suffix alone"
        return mode, why

    def _model_speculation(self) -> tuple[str, str]:
        """(``on`` | ``degraded`` | ``off``, why) of drafting with the draft model right now."""
        if self.draft is None:
            return "off", "no draft model deployed"
        if self.config.supervise and not self.draft.healthy:
            return "off", f"draft {self.draft.state.value}: {self.draft.last_error}"
        state = self.governor.breaker.state
        if state is BreakerState.OPEN:
            return "off", "breaker open"
        if state is BreakerState.HALF_OPEN:
            return "degraded", "breaker half-open: a share of requests speculates, as probes"
        if state is BreakerState.SOFT:
            return "degraded", "breaker soft: k halved, fewer requests speculate"
        return "on", "draft healthy, breaker closed"

    def snapshot(self) -> dict:
        gov = self.governor.snapshot()
        mode, why = self.speculation()
        out: dict = {
            "model": self.model_name,
            "speculation": mode,
            "speculation_reason": why,
            "supervised": self.config.supervise,
            "target": self.target.snapshot() if self.target is not None else None,
            "draft": None,
            "breaker": gov.breaker.to_dict(),
            "governor": {
                "requests_total": gov.requests_total,
                "decisions": gov.decisions,
                "speculating_now": gov.speculating_now,
                "k_max_now": gov.k_max_now,
                "fallbacks_total": gov.fallbacks_total,
                "goodput": gov.goodput if self.draft is not None else None,  # the draft model's estimates
                "k_choices": gov.k_choices,
            },
        }
        if self.target is not None:
            out["target"]["calls"] = self._calls_snapshot(self.target.name)
        if self.draft is not None:
            out["draft"] = {**self.draft.snapshot(), "deadline": self.draft_deadline.snapshot(),
                            "errors": self.draft_errors, "calls": self._calls_snapshot(self.draft.name)}
        if self._extra_status is not None:
            out.update(self._extra_status())
        return out

    def _calls_snapshot(self, name: str) -> dict | None:
        guard = self._guards.get(name)
        return guard.snapshot() if guard is not None else None

    def write_status(self) -> None:
        if self._status_path is not None:
            try:
                statusfile.write_status(self._status_path, self.snapshot())
            except Exception as e:  # never let the status take anything down
                self._log_error(f"status file: {type(e).__name__}: {e}")

    def _status_loop(self) -> None:
        while not self._stop.is_set():
            self.write_status()
            self._stop.wait(self.config.status_interval_s)


class _DraftHooks:
    """Draft calls: deadline estimate, breaker, supervisor (see the module docstring)."""

    def __init__(self, health: DeploymentHealth) -> None:
        self.h = health

    def on_ok(self, seconds: float, work: Work) -> None:
        h = self.h
        h.draft_deadline.observe(seconds, work)
        h._late_streak = 0
        if h.draft is not None:
            h.draft.report_ok()

    def on_late(self, k: int, deadline_s: float) -> None:
        h = self.h
        h.draft_deadline.observe_late()
        if k > 0:
            h.governor.breaker.observe(k, 0)
        h._late_streak += 1
        strikes = h.config.draft_late_strikes
        if strikes > 0 and h._late_streak >= strikes and h.draft is not None:
            h._late_streak = 0
            h.draft.report_error(f"{strikes} draft calls in a row missed their deadline ({deadline_s * 1000:.0f} ms)")

    def on_late_answer(self) -> None:
        if self.h.draft is not None:
            self.h.draft.report_ok()

    def on_error(self, k: int, error: BaseException, started_at: float) -> None:
        if not isinstance(error, BLSError):
            return  # a local error (the loop's own checks): nothing to learn about the draft's health
        h = self.h
        h.draft_errors += 1
        if k > 0:
            h.governor.breaker.observe(k, 0)
        if h.draft is not None:
            h.draft.report_error(one_line(error), fatal=isinstance(error, StubDeadError), started_at=started_at)


class _TargetHooks:
    def __init__(self, supervisor: ModelSupervisor) -> None:
        self.sup = supervisor

    def on_ok(self, seconds: float, work: Work) -> None:
        self.sup.report_ok()

    def on_late(self, k: int, deadline_s: float) -> None:
        self.sup.report_error(f"no answer within {deadline_s:g}s")

    def on_late_answer(self) -> None:
        self.sup.report_ok()

    def on_error(self, k: int, error: BaseException, started_at: float) -> None:
        if isinstance(error, BLSError):
            self.sup.report_error(one_line(error), fatal=isinstance(error, StubDeadError), started_at=started_at)


def _server_ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/v2/health/ready", timeout=5) as r:
            return r.status == 200
    except (urllib.error.URLError, OSError):
        return False


def _model_state(url: str, name: str) -> str:
    """Triton's state of ``name`` in its repository index (``READY``, ``LOADING``, ...); "" when unknown."""
    req = urllib.request.Request(f"{url}/v2/repository/index", data=b"{}", method="POST",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            index = json.loads(r.read() or b"[]")
    except (urllib.error.URLError, OSError, ValueError):
        return ""
    states = [m.get("state", "") for m in index if isinstance(m, dict) and m.get("name") == name]
    return str(states[0]) if states else ""


def _reload_over_http(url: str, name: str, stop: threading.Event) -> None:
    """Unload ``name`` through Triton's HTTP repository API, wait until it is no longer ready, load it."""

    def post(path: str, timeout_s: float) -> None:
        req = urllib.request.Request(f"{url}{path}", data=b"{}", method="POST",
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=timeout_s) as r:
                r.read()
        except urllib.error.HTTPError as e:
            body = e.read().decode(errors="replace")
            try:
                body = str(json.loads(body).get("error", body))
            except (ValueError, AttributeError):
                pass
            raise BLSError(f"{path}: HTTP {e.code}: {one_line(body)}") from None

    def ready() -> bool:
        try:
            with urllib.request.urlopen(f"{url}/v2/models/{name}/ready", timeout=5) as r:
                return r.status == 200
        except (urllib.error.URLError, OSError):
            return False

    post(f"/v2/repository/models/{name}/unload", 60)
    deadline = time.monotonic() + UNLOAD_WAIT_S
    while ready() and time.monotonic() < deadline:
        stop.wait(0.05)  # unloading is asynchronous: poll until it is done
    post(f"/v2/repository/models/{name}/load", LOAD_TIMEOUT_S)
