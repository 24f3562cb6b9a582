"""The recorder between the loop's stats and the exporters (STYLE item 7, layer 2).

Layer 1 is the loop's own record (:class:`~trtspec.decoding.types.IterationOutcome`
per iteration, :class:`~trtspec.decoding.types.SpecStats` per request); layer 3 the
sinks (:mod:`trtspec.obs.sinks`). :class:`SpecMetrics` turns the first into the
families of :mod:`trtspec.obs.metrics` on the second. One per serving model;
every method is safe from any thread and never raises (a broken exporter must
not fail a request: failures are logged).

How a serving model uses it, per request::

    metrics = SpecMetrics(TritonMetricSink(pb_utils), model="spec_decode")   # once
    governor = SpeculationGovernor(policy, breaker_listeners=[metrics])      # breaker transitions
    ...
    timer = TokenTimer()                                   # at the request's start
    control = governor.decide(info)
    metrics.request_started(control.speculate, control.reason)
    gen = decoder.stream(req, metrics.wrap_policy(control, req.request_id), cancelled)
    for chunk in gen:
        timer.tokens(len(chunk.token_ids))
        ...
    metrics.request_finished(gen.result.stats, speculating=control.speculate,
                             ttft_s=timer.ttft_s, itl_s=timer.itl_s, latency_s=timer.elapsed_s(),
                             fallbacks=control.fallback.fallbacks)
    metrics.set_gauges(governor.snapshot())                # now and then
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from trtspec.control.breaker import BreakerState
from trtspec.control.governor import GovernorSnapshot
from trtspec.obs import metrics as M
from trtspec.obs.sinks import MetricSink
from trtspec.obs.trace import RejectionTracer
from trtspec.decoding.protocols import DraftLengthPolicy, choose_drafter
from trtspec.decoding.types import DrafterKind, IterationOutcome, SpecStats

log = logging.getLogger("trtspec.obs")

F = TypeVar("F", bound=Callable[..., Any])

DRAFT_LENGTH_EMA = 0.1  # weight of the newest draft in the trtspec_draft_length moving average


def _never_raises(fn: F) -> F:
    """Log (rate-limited) instead of raising: metrics must never fail a request."""

    @functools.wraps(fn)
    def wrapper(self: SpecMetrics, *args: Any, **kwargs: Any) -> Any:
        try:
            return fn(self, *args, **kwargs)
        except Exception:
            self.errors += 1
            if self.errors <= 10 or self.errors % 1000 == 0:
                log.exception("trtspec metrics: %s failed (%d failures so far)", fn.__name__, self.errors)
            return None

    return wrapper  # type: ignore[return-value]


class SpecMetrics:
    """Aggregates loop outcomes, request results, breaker transitions and governor snapshots into a sink.

    Also a :class:`~trtspec.control.breaker.BreakerListener` (``on_transition``).
    """

    def __init__(self, sink: MetricSink, model: str = "spec_decode", tracer: RejectionTracer | None = None) -> None:
        self.sink = sink
        self.model = model
        self.tracer = tracer
        self.errors = 0
        self._lock = threading.Lock()
        self._speculating = 0
        self._mean_k: float | None = None
        self._positions: set[tuple[str, str]] = set()  # (drafter, position) labels seen (declared)
        self._declare()

    def _l(self, **labels: str) -> dict[str, str]:
        return {"model": self.model, **labels}

    def _declare(self) -> None:
        """Series that exist from the start at zero (so rate() and the alert rules see them at once)."""
        s, l = self.sink, self._l
        for spec in (M.BONUS_TOKENS, M.EMITTED_TOKENS, M.FALLBACK_REQUESTS):
            s.declare(spec, l())
        for drafter in M.DRAFTERS:
            for spec in (M.DRAFTED_TOKENS, M.TESTED_TOKENS, M.ACCEPTED_TOKENS):
                s.declare(spec, l(drafter=drafter))
            for bucket in M.BUCKET_LABELS:
                s.declare(M.DRAFTS, l(drafter=drafter, bucket=bucket))
                s.declare(M.REJECTIONS, l(drafter=drafter, bucket=bucket))
        for reason in M.FALLBACK_REASONS:
            s.declare(M.FALLBACKS, l(reason=reason))
        for old, new in M.BREAKER_STATE_CHANGES:
            s.declare(M.BREAKER_TRANSITIONS, l(from_state=old, to_state=new))
        for route in M.ROUTES:
            for spec in (M.TTFT, M.ITL, M.REQUEST_LATENCY):
                s.declare(spec, l(route=route))
        for spec in (M.ACCEPTED_PER_ITERATION, M.DRAFT_STEP, M.VERIFY_STEP, M.TARGET_STEP):
            s.declare(spec, l())
        s.set(M.SPECULATING_NOW, l(), 0)
        self._set_breaker_state(BreakerState.CLOSED.value)

    # -- per request ---------------------------------------------------------------

    @_never_raises
    def request_started(self, speculate: bool, reason: str) -> None:
        """A request was routed: ``speculate`` (the route decision) and its ``reason``."""
        self.sink.inc(M.ROUTE_DECISIONS, self._l(route=M.route_label(speculate), reason=reason or "unknown"))
        if speculate:
            with self._lock:
                self._speculating += 1
                n = self._speculating
            self.sink.set(M.SPECULATING_NOW, self._l(), n)

    @_never_raises
    def k_chosen(self, drafter: str, reason: str) -> None:
        """A speculating request chose its next ``k``: which drafter, and why (``RequestControl.why``)."""
        self.sink.inc(M.K_CHOICES, self._l(drafter=drafter, reason=reason))

    @_never_raises
    def iteration(
        self,
        outcome: IterationOutcome,
        seq_len: int | None = None,
        *,
        request_id: str = "",
        drafted: Sequence[int] | None = None,
        target_tokens: Sequence[int] | None = None,
    ) -> None:
        """One loop iteration. ``seq_len``: tokens in the sequence before it (default ``outcome.context_len``).

        With ``drafted`` (the draft's tokens) and ``target_tokens`` (the target's at those positions)
        a rejection is offered to the tracer (which samples it).
        """
        s, l = self.sink, self._l
        k, acc = outcome.k, outcome.accepted
        assert 0 <= acc <= k, outcome
        if outcome.emitted:
            s.inc(M.EMITTED_TOKENS, l(), outcome.emitted)
        if k == 0:
            s.observe(M.TARGET_STEP, l(), outcome.verify_time_s)
            return
        n = outcome.context_len if seq_len is None else seq_len
        bucket = M.length_bucket(n)
        drafter = outcome.drafter or DrafterKind.MODEL.value
        s.inc(M.DRAFTS, l(drafter=drafter, bucket=bucket))
        s.inc(M.DRAFTED_TOKENS, l(drafter=drafter), k)
        s.inc(M.TESTED_TOKENS, l(drafter=drafter), outcome.tested)
        if acc:
            s.inc(M.ACCEPTED_TOKENS, l(drafter=drafter), acc)
        if outcome.bonus:
            s.inc(M.BONUS_TOKENS, l())
        drafted_at: Counter[str] = Counter(M.position_label(i) for i in range(1, k + 1))
        accepted_at: Counter[str] = Counter(M.position_label(i) for i in range(1, acc + 1))
        for pos, count in drafted_at.items():
            s.inc(M.DRAFTED_BY_POSITION, l(drafter=drafter, position=pos), count)
            if pos in accepted_at:
                s.inc(M.ACCEPTED_BY_POSITION, l(drafter=drafter, position=pos), accepted_at[pos])
            elif (drafter, pos) not in self._positions:  # so a position never accepted reads 0, not nothing
                s.declare(M.ACCEPTED_BY_POSITION, l(drafter=drafter, position=pos))
            self._positions.add((drafter, pos))
        if acc < k:
            s.inc(M.REJECTIONS, l(drafter=drafter, bucket=bucket))
            if self.tracer is not None and drafted is not None and target_tokens is not None:
                self.tracer.record(request_id, outcome, drafted, target_tokens, seq_len=n)
        s.observe(M.ACCEPTED_PER_ITERATION, l(), acc)
        s.observe(M.DRAFT_STEP, l(), outcome.draft_time_s)
        s.observe(M.VERIFY_STEP, l(), outcome.verify_time_s)
        with self._lock:
            self._mean_k = k if self._mean_k is None else (1 - DRAFT_LENGTH_EMA) * self._mean_k + DRAFT_LENGTH_EMA * k
            mean_k = self._mean_k
        s.set(M.DRAFT_LENGTH, l(), mean_k)

    @_never_raises
    def request_finished(
        self,
        stats: SpecStats | None,
        *,
        speculating: bool,
        outcome: str = "ok",
        ttft_s: float | None = None,
        itl_s: Sequence[float] | float | None = None,
        latency_s: float | None = None,
        fallbacks: int = 0,
    ) -> None:
        """A request that :meth:`request_started` ended, however it ended (call it from ``finally``).

        ``ttft_s`` / ``latency_s`` default to the loop's own (``stats.time_to_first_token_s``,
        ``stats.total_time_s``; the server-side ones from :class:`TokenTimer` also count tokenization
        and queueing). ``itl_s``: the per-chunk inter-token latencies (:attr:`TokenTimer.itl_s`), or one
        value; default one observation of the request's mean. Request latency is observed for
        ``outcome == "ok"`` only. ``fallbacks``: times the fallback guard sent this request to the
        target alone (``RequestControl.fallback.fallbacks``). The request is counted last, so a
        scrape that counts it also holds its latencies and fallbacks.
        """
        s, l = self.sink, self._l
        route = M.route_label(speculating)
        if speculating:
            with self._lock:
                self._speculating = max(0, self._speculating - 1)
                n = self._speculating
            s.set(M.SPECULATING_NOW, l(), n)
        if stats is not None:
            if ttft_s is None:
                ttft_s = stats.time_to_first_token_s
            if latency_s is None and stats.emitted_tokens:
                latency_s = stats.total_time_s
            if itl_s is None and ttft_s is not None and latency_s is not None and stats.emitted_tokens > 1:
                itl_s = max(0.0, latency_s - ttft_s) / (stats.emitted_tokens - 1)
        if ttft_s is not None:
            s.observe(M.TTFT, l(route=route), ttft_s)
        if latency_s is not None and outcome == "ok":  # a cancelled or failed request has no "last token"
            s.observe(M.REQUEST_LATENCY, l(route=route), latency_s)
        for v in [itl_s] if isinstance(itl_s, (int, float)) else (itl_s or ()):
            s.observe(M.ITL, l(route=route), v)
        draft_errors = stats.draft_errors if stats is not None else 0
        if fallbacks:
            s.inc(M.FALLBACKS, l(reason=M.FALLBACK_ZERO_ACCEPTANCE), fallbacks)
        if draft_errors:
            s.inc(M.FALLBACKS, l(reason=M.FALLBACK_DRAFT_ERROR), draft_errors)
        if speculating and (fallbacks or draft_errors):
            s.inc(M.FALLBACK_REQUESTS, l())
        s.inc(M.REQUESTS, l(outcome=outcome))  # last: a scrape that counts the request sees all of it

    @_never_raises
    def request_refused(self, outcome: str) -> None:
        """A request that ended before routing (``invalid``, ``unavailable`` while shutting down, ...)."""
        self.sink.inc(M.REQUESTS, self._l(outcome=outcome))

    @_never_raises
    def fallback(self, reason: str, n: int = 1) -> None:
        """Fallbacks the request path knows of besides the ones :meth:`request_finished` counts."""
        self.sink.inc(M.FALLBACKS, self._l(reason=reason), n)

    def wrap_policy(self, policy: DraftLengthPolicy, request_id: str = "") -> MeteredPolicy:
        """``policy`` (e.g. a ``RequestControl``) that also records every iteration here."""
        return MeteredPolicy(policy, self, request_id)

    # -- deployment-wide ---------------------------------------------------------------

    @_never_raises
    def on_transition(self, old: BreakerState, new: BreakerState, reason: str, rate: float | None) -> None:
        """The breaker listener (``SpeculationGovernor(..., breaker_listeners=[metrics])``)."""
        self.sink.inc(M.BREAKER_TRANSITIONS, self._l(from_state=_state(old), to_state=_state(new)))
        self._set_breaker_state(_state(new))
        if rate is not None:
            self.sink.set(M.ROLLING_REJECTION_RATE, self._l(), rate)

    @_never_raises
    def set_gauges(
        self,
        snapshot: GovernorSnapshot | None = None,
        *,
        draft_memory_bytes: int | None = None,
        target_memory_bytes: int | None = None,
    ) -> None:
        """The governor's state (breaker state, rolling rejection rate, k cap) and the models' memory."""
        s, l = self.sink, self._l
        if snapshot is not None:
            self._set_breaker_state(_state(snapshot.breaker.state))
            rate = snapshot.breaker.rejection_rate
            s.set(M.ROLLING_REJECTION_RATE, l(), float("nan") if rate is None else rate)
            s.set(M.DRAFT_LENGTH_CAP, l(), snapshot.k_max_now)
        for role, value in (("draft", draft_memory_bytes), ("target", target_memory_bytes)):
            if value is not None:
                s.set(M.MODEL_MEMORY, l(role=role), value)

    def _set_breaker_state(self, current: str) -> None:
        for state in M.BREAKER_STATES:
            self.sink.set(M.BREAKER_STATE, self._l(state=state), 1.0 if state == current else 0.0)


def _state(state: BreakerState | str) -> str:
    return state.value if isinstance(state, BreakerState) else str(state)


class MeteredPolicy:
    """A :class:`~trtspec.decoding.protocols.DraftLengthPolicy` that records each outcome, then passes it on.

    The loop calls ``policy.observe(outcome)`` once per iteration; this is how the recorder sees
    iterations without the loop knowing of metrics.
    """

    def __init__(self, policy: DraftLengthPolicy, metrics: SpecMetrics, request_id: str = "") -> None:
        self.policy = policy
        self.metrics = metrics
        self.request_id = request_id

    def next_k(self) -> int:
        k = self.policy.next_k()
        why = getattr(self.policy, "why", None)  # RequestControl's: drafter:reason, None when not speculating
        if why is not None:
            self.metrics.k_chosen(*why.split(":", 1))
        return k

    def next_drafter(self, names: Sequence[str]) -> str:
        """The wrapped policy's choice when it makes one (:class:`~trtspec.decoding.protocols.DrafterChoice`)."""
        return choose_drafter(self.policy, names)

    def observe(self, outcome: IterationOutcome) -> None:
        self.metrics.iteration(
            outcome, request_id=self.request_id, drafted=outcome.drafted, target_tokens=outcome.target_tokens
        )
        self.policy.observe(outcome)


class TokenTimer:
    """Server-side token timing of one request: time to first token and per-chunk inter-token latency.

    Create it when the request starts; call :meth:`tokens` with each chunk's token count as it is
    sent. ``itl_s`` holds one value per chunk after the first: the time since the previous chunk
    divided by the chunk's tokens (a speculative iteration emits several tokens at once).
    """

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self._clock = clock
        self.started = clock()
        self.ttft_s: float | None = None
        self.itl_s: list[float] = []
        self.tokens_seen = 0
        self._last: float | None = None

    def tokens(self, n: int) -> None:
        if n <= 0:
            return  # a chunk of text only (a pending stop string resolved), no new tokens
        now = self._clock()
        if self._last is None:
            self.ttft_s = now - self.started
        else:
            self.itl_s.append((now - self._last) / n)
        self._last = now
        self.tokens_seen += n

    def elapsed_s(self) -> float:
        return self._clock() - self.started
