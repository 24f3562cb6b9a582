"""The facade the serving layer calls: one :class:`SpeculationGovernor` per
deployment, one :class:`RequestControl` per request.

Per request::

    governor = SpeculationGovernor(load_policy("policy.yaml"))   # once
    ...
    with governor.decide(RequestInfo.from_request(req, priority="normal")) as control:
        decoder = spec_decoder if control.speculate else target_only_decoder
        result = decoder.generate(req, control)   # control is the DraftLengthPolicy
    # leaving the block calls control.finish(): the admission slot is released

``decide`` runs the checks in this order; the first that says no gives the
reason and the request runs on the target alone:

1. the deployment has no working draft (``draft_unavailable``);
2. the request said ``speculation: off`` (``request_off``);
3. rollout: ``rollout_off`` / ``offline_only`` / ``canary_excluded`` (``on``
   passes the canary draw);
4. the routing rules, first match wins (skipped for ``speculation: on``,
   whose reason is ``forced_on``);
5. admission: a free slot under the cap for the request's priority (``quota``);
6. the breaker, which guards the draft model only: OPEN (``breaker_open``);
   HALF_OPEN lets a share of requests through as probes (``breaker_half_open``
   for the others; ``on`` requests always probe). A request drafted by
   ``ngram`` or ``suffix`` skips it; an ``auto`` request it bars still
   speculates, with its free drafter alone.

Per iteration, :meth:`RequestControl.next_k` returns 0, for the draft model,
while the request's fallback cools down or the breaker is OPEN (or HALF_OPEN
for a request that is not a probe), else the controller's ``k`` capped at
``k_max`` (the model's halved while the breaker is SOFT);
:meth:`RequestControl.next_drafter` does not offer ``auto`` the model while the
breaker or the fallback bars it. ``observe`` feeds the breaker and the fallback
guard (the model's iterations) and the controller. Shared state (breaker, admission, rollout, goodput
estimates, counters) is locked; a ``RequestControl`` belongs to the one thread
that runs its request.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType

from trtspec.control.admission import Admission
from trtspec.control.breaker import BreakerListener, BreakerSnapshot, BreakerState, CircuitBreaker
from trtspec.control.clock import Clock
from trtspec.control.config import ControllerKind, DraftLengthConfig, Policy, Priority
from trtspec.control.controllers import DraftLengthController, HeuristicController, StaticController, StepController
from trtspec.control.fallback import FallbackGuard
from trtspec.control.goodput import AutoDrafterController, GoodputController, GoodputModel
from trtspec.control.rollout import Rollout, RolloutStatus
from trtspec.control.router import Router
from trtspec.control.types import Reason, RequestInfo, RouteDecision, Speculation
from trtspec.decoding.protocols import DrafterChoice
from trtspec.decoding.types import DrafterKind, IterationOutcome

log = logging.getLogger("trtspec.control")


def make_controller(
    config: DraftLengthConfig,
    clock: Clock,
    goodput: GoodputModel | Mapping[str, GoodputModel],
    info: RequestInfo | None = None,
    auto_free: DrafterKind = DrafterKind.SUFFIX,
) -> DraftLengthController:
    """A fresh per-request controller of the kind ``config.controller`` names.

    ``goodput``: the shared estimates, one model per drafter name (a single model stands for
    every drafter). A goodput controller for an ``auto`` request chooses between the free
    drafter ``auto_free`` and the draft model each iteration; other kinds draft with the first
    drafter the request has (the free one)."""
    kind = config.controller
    if kind is ControllerKind.STATIC:
        return StaticController(config.static)
    if kind is ControllerKind.STEP:
        return StepController(config.step, clock)
    if kind is ControllerKind.HEURISTIC:
        return HeuristicController(config.heuristic, config.k_max)
    assert kind is ControllerKind.GOODPUT, kind
    max_new_tokens = info.max_new_tokens if info is not None else 0
    drafter = info.drafter if info is not None else DrafterKind.MODEL

    def one(name: str) -> GoodputController:
        model = goodput if isinstance(goodput, GoodputModel) else goodput[name]
        return GoodputController(model, config.k_max, config.goodput, max_new_tokens=max_new_tokens)

    if drafter is DrafterKind.AUTO:
        return AutoDrafterController({auto_free.value: one(auto_free.value), DrafterKind.MODEL.value: one("model")})
    return one(drafter.value)


@dataclass(frozen=True)
class GovernorSnapshot:
    """Everything the metrics layer reads, at one instant."""

    breaker: BreakerSnapshot
    speculating_now: int  # requests holding an admission slot
    admission_limit: int  # the cap for normal priority in the current breaker state
    k_max_now: int  # the k cap in the current breaker state (0 when nothing may draft)
    last_k: int | None  # the k of the most recent iteration of any speculating request
    mean_k: float | None  # moving average of k over iterations of speculating requests
    requests_total: int
    decisions: dict[str, int]  # requests by decision reason
    k_choices: dict[str, int]  # speculating iterations by ``drafter:why`` their k was chosen (RequestControl.why)
    fallbacks_total: int  # fallbacks started (3 zero-accept iterations)
    rollout: RolloutStatus
    goodput: dict | None  # the shared goodput estimates (when the controller is goodput)

    def to_dict(self) -> dict:
        return {
            "breaker": self.breaker.to_dict(),
            "speculating_now": self.speculating_now,
            "admission_limit": self.admission_limit,
            "k_max_now": self.k_max_now,
            "last_k": self.last_k,
            "mean_k": self.mean_k,
            "requests_total": self.requests_total,
            "decisions": dict(self.decisions),
            "k_choices": dict(self.k_choices),
            "fallbacks_total": self.fallbacks_total,
            "rollout": self.rollout.to_dict(),
            "goodput": self.goodput,
        }


class SpeculationGovernor:
    """Decides per request whether to speculate and hands out per-request draft-length policies."""

    def __init__(
        self,
        policy: Policy | None = None,
        clock: Clock = time.monotonic,
        breaker_listeners: Iterable[BreakerListener] = (),
    ) -> None:
        self.policy = policy or Policy()
        self.clock = clock
        self.router = Router(self.policy.routing)
        self.breaker = CircuitBreaker(self.policy.breaker, clock, breaker_listeners)
        self.admission = Admission(self.policy.admission)
        self.rollout = Rollout(self.policy.rollout)
        # the shared goodput estimates of each drafter (acceptance and cost differ by drafter)
        k_max, gp = self.policy.draft_length.k_max, self.policy.draft_length.goodput
        self.goodput_by_drafter = {
            kind.value: GoodputModel(k_max, gp) for kind in DrafterKind if kind is not DrafterKind.AUTO
        }
        self.goodput = self.goodput_by_drafter[DrafterKind.MODEL.value]  # the draft model's
        self._lock = threading.Lock()
        self._draft_available = True
        self._requests = 0
        self._decisions: Counter[str] = Counter()
        self._k_choices: Counter[str] = Counter()
        self._fallbacks = 0
        self._last_k: int | None = None
        self._mean_k: float | None = None

    # -- per request -----------------------------------------------------------

    def decide(self, info: RequestInfo) -> RequestControl:
        """Route one request; the returned control must be finished (``with`` or ``finish()``)."""
        route = self._route(info)
        with self._lock:
            self._requests += 1
            self._decisions[route.reason] += 1
        log.debug("request %r: speculate=%s reason=%s", info.request_id, route.speculate, route.reason)
        controller = None
        if route.speculate:
            controller = make_controller(
                self.policy.draft_length, self.clock, self.goodput_by_drafter, info, self.policy.drafters.auto_free
            )
        return RequestControl(self, info, route, controller)

    def _route(self, info: RequestInfo) -> RouteDecision:
        state = self.breaker.state.value
        if not self._draft_available and info.drafter is DrafterKind.MODEL:  # the free drafters need none
            return RouteDecision(False, Reason.DRAFT_UNAVAILABLE.value, state)
        if info.speculation is Speculation.OFF:
            return RouteDecision(False, Reason.REQUEST_OFF.value, state)
        excluded = self.rollout.exclusion(info)
        if excluded is not None:
            return RouteDecision(False, excluded.value, state)
        forced = info.speculation is Speculation.ON
        if forced:
            reason = Reason.FORCED_ON.value
        else:
            verdict = self.router.route(info)
            if not verdict.speculate:
                return RouteDecision(False, verdict.reason, state)
            reason = verdict.reason
        return self._admit(info, reason, forced)

    def _admit(self, info: RequestInfo, reason: str, forced: bool) -> RouteDecision:
        """Admission, then the breaker, which guards the draft model only: a free drafter never
        calls it (and ``auto`` drafts with its free drafter alone while the breaker bars the model)."""
        state = self.breaker.state
        degraded = not info.drafter.free and state in (BreakerState.SOFT, BreakerState.HALF_OPEN)
        if not self.admission.try_acquire(info.priority, degraded):
            return RouteDecision(False, Reason.QUOTA.value, state.value)
        if info.drafter.free:
            return RouteDecision(True, reason, state.value)
        state, allowed = self.breaker.admit(force=forced)
        if allowed or info.drafter is DrafterKind.AUTO:
            return RouteDecision(True, reason, state.value, probe=allowed and state is BreakerState.HALF_OPEN)
        self.admission.release()
        why = Reason.BREAKER_OPEN if state is BreakerState.OPEN else Reason.BREAKER_HALF_OPEN
        return RouteDecision(False, why.value, state.value)

    def k_cap(self, probe: bool, drafter: DrafterKind = DrafterKind.MODEL) -> int:
        """The largest ``k`` a speculating request may draft now with ``drafter`` (0: none); the
        breaker caps the draft model only."""
        k_max = self.policy.draft_length.k_max
        if drafter.free:
            return k_max
        state = self.breaker.state
        if state is BreakerState.OPEN:
            return 0
        if state is BreakerState.HALF_OPEN:
            return k_max if probe else 0
        if state is BreakerState.SOFT:
            return max(1, k_max // 2)
        return k_max

    # -- deployment-wide ---------------------------------------------------------

    def set_draft_available(self, available: bool) -> None:
        """Mark the draft model up or down (the serving layer's health checks call this)."""
        with self._lock:
            if available != self._draft_available:
                log.warning("draft model %s", "available again" if available else "unavailable")
            self._draft_available = available

    def snapshot(self) -> GovernorSnapshot:
        breaker = self.breaker.snapshot()
        degraded = breaker.state in (BreakerState.SOFT, BreakerState.HALF_OPEN)
        goodput = (
            self.goodput.snapshot() if self.policy.draft_length.controller is ControllerKind.GOODPUT else None
        )
        with self._lock:
            last_k, mean_k, requests = self._last_k, self._mean_k, self._requests
            decisions, fallbacks = dict(self._decisions), self._fallbacks
            k_choices = dict(self._k_choices)
        return GovernorSnapshot(
            breaker=breaker,
            speculating_now=self.admission.active,
            admission_limit=self.admission.limit(Priority.NORMAL, degraded),
            k_max_now=self.k_cap(probe=False),
            last_k=last_k,
            mean_k=mean_k,
            requests_total=requests,
            decisions=decisions,
            k_choices=k_choices,
            fallbacks_total=fallbacks,
            rollout=self.rollout.status(),
            goodput=goodput,
        )

    # -- called by RequestControl --------------------------------------------------

    def _note_k(self, k: int, why: str) -> None:
        with self._lock:
            self._k_choices[why] += 1
            self._last_k = k
            self._mean_k = k if self._mean_k is None else 0.95 * self._mean_k + 0.05 * k

    def _note_fallback(self, info: RequestInfo) -> None:
        with self._lock:
            self._fallbacks += 1
        log.debug("request %r falls back to the target alone (zero acceptance)", info.request_id)


class RequestControl:
    """One request's route decision and its :class:`~trtspec.decoding.protocols.DraftLengthPolicy`.

    Pass it to ``SpeculativeDecoder.stream/generate`` as the policy; call
    :meth:`finish` (or use ``with``) when the request ends, however it ends.
    """

    def __init__(
        self,
        governor: SpeculationGovernor,
        info: RequestInfo,
        route: RouteDecision,
        controller: DraftLengthController | None,
    ) -> None:
        self.governor = governor
        self.info = info
        self.route = route
        self.controller = controller
        self.fallback = FallbackGuard(governor.policy.fallback)
        self.finished = False
        self.last_k: int | None = None
        self.last_cause = "not_speculating"  # why last_k: controller | breaker | fallback | not_speculating
        self.why: str | None = None  # drafter:reason of last_k (_why); None until a speculating request chose one
        self._observed = 0
        self._prev_k: int | None = None
        self._drafter = info.drafter  # what drafts the next iteration (auto: chosen per iteration)

    @property
    def speculate(self) -> bool:
        return self.route.speculate

    @property
    def reason(self) -> str:
        return self.route.reason

    def next_k(self) -> int:
        if not self.route.speculate or self.finished or self.controller is None:
            k, cause = 0, "not_speculating"
        elif (barred := self._barred(self._drafter)) is not None:
            k, cause = 0, barred
        else:
            cap = self.governor.k_cap(self.route.probe, self._drafter)
            k, cause = max(0, min(self.controller.next_k(), cap)), "controller"
        self.last_k, self.last_cause = k, cause
        if self.route.speculate:
            self.why = self._why(cause)
            self.governor._note_k(k, self.why)
        return k

    def _why(self, cause: str) -> str:
        """``drafter:reason`` of a ``k``: the controller's reason where it gives one (goodput: ``best``,
        ``explore``, ``probe``, ``redraw``, ``young``, ``nothing_pays``, ``not_worth_it``, ``wait``),
        else ``controller``, or what barred drafting (``breaker``, ``fallback``)."""
        reason = getattr(self.controller, "last_reason", cause) if cause == "controller" else cause
        return reason if ":" in reason else f"{self._drafter.value}:{reason}"

    def next_drafter(self, names: Sequence[str]) -> str:
        """The controller's choice when it chooses (``auto`` under goodput), else the first; the
        draft model is not offered while the breaker or the fallback bars it and another drafter is open."""
        if isinstance(self.controller, DrafterChoice):
            offered = [n for n in names if self._barred(DrafterKind(n)) is None]
            name = self.controller.next_drafter(offered or names)
        else:
            name = names[0]
        self._drafter = DrafterKind(name)
        return name

    def _barred(self, drafter: DrafterKind) -> str | None:
        """What bars ``drafter`` now (``breaker`` | ``fallback``; both guard the draft model), else None."""
        if self.governor.k_cap(self.route.probe, drafter) == 0:
            return "breaker"
        if self.fallback.active and not drafter.free:
            return "fallback"
        return None

    def observe(self, outcome: IterationOutcome) -> None:
        gov = self.governor
        if not outcome.free_drafted:  # the breaker guards the draft model
            gov.breaker.observe(outcome.k, outcome.accepted)
        if self.controller is not None:
            self.controller.observe(outcome)
        else:  # target-only traffic still teaches the goodput model what a target step costs
            steady = self._prev_k is not None and self._prev_k > 0
            gov.goodput.observe(outcome, first=self._observed == 0, steady_draft=steady)
        if self.fallback.observe(outcome):
            gov._note_fallback(self.info)
        self._observed += 1
        self._prev_k = outcome.k

    def finish(self) -> None:
        """Release the admission slot and record the outcome; idempotent."""
        if self.finished:
            return
        self.finished = True
        if self.route.speculate:
            self.governor.admission.release()
            self.governor.rollout.record(fell_back=self.fallback.fallbacks > 0)
        if self.controller is not None:
            self.controller.finish()

    def __enter__(self) -> RequestControl:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.finish()

    def to_dict(self) -> dict:
        return {
            **self.route.to_dict(),
            "last_k": self.last_k,
            "last_cause": self.last_cause,
            "fallback_active": self.fallback.active,
            "fallbacks": self.fallback.fallbacks,
        }
