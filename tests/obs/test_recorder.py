"""SpecMetrics on the real loop (tiny models) into a prometheus_client registry: every number
on the registry agrees with what the loop recorded per request and per iteration."""

from __future__ import annotations

import dataclasses
import math
import threading
import time
from collections import Counter

import pytest

from trtspec.control import BreakerState, CircuitBreaker, FakeClock, Policy, RequestInfo, SpeculationGovernor
from trtspec.control.config import BreakerConfig
from trtspec.obs import metrics as M
from trtspec.obs.recorder import SpecMetrics, TokenTimer
from trtspec.obs.sinks import PrometheusClientSink, QueuedSink, TritonMetricSink
from trtspec.runtime.pair import ModelPair
from trtspec.decoding import FixedDraftLength, GenerationRequest, StopCriteria
from trtspec.decoding.types import IterationOutcome, SpecStats
from trtspec.testing.fake_triton import FakeTriton

PROMPTS = ["The quick brown fox", "Hello world! How are", "def f(x): return", "Numbers 0 1 2"]
MODEL = "spec_decode"


class Keep:
    """A policy that keeps every outcome the loop reports (to compare with the registry)."""

    def __init__(self, k: int) -> None:
        self.inner = FixedDraftLength(k)
        self.outcomes: list[IterationOutcome] = []

    def next_k(self) -> int:
        return self.inner.next_k()

    def observe(self, outcome: IterationOutcome) -> None:
        self.outcomes.append(outcome)


def _outcome(k: int, accepted: int, context_len: int = 10, emitted: int | None = None) -> IterationOutcome:
    return IterationOutcome(
        k=k,
        accepted=accepted,
        emitted=accepted + 1 if emitted is None else emitted,
        bonus=k > 0 and accepted == k,
        context_len=context_len,
        draft_time_s=0.002 * k,
        verify_time_s=0.01,
    )


@pytest.fixture
def sink() -> PrometheusClientSink:
    return PrometheusClientSink()


@pytest.fixture
def metrics(sink: PrometheusClientSink) -> SpecMetrics:
    return SpecMetrics(sink, model=MODEL)


def _v(sink: PrometheusClientSink, series: str, **labels: str) -> float:
    value = sink.value(series, {"model": MODEL, **labels})
    assert value is not None, f"no series {series} {labels}"
    return value


def test_counters_agree_with_the_loop(tiny_pair: ModelPair, sink: PrometheusClientSink, metrics: SpecMetrics) -> None:
    decoder = tiny_pair.decoder()
    tok = tiny_pair.target.tokenizer
    stats: list[tuple[bool, SpecStats]] = []
    outcomes: list[IterationOutcome] = []
    chunks_with_tokens = 0
    for i, text in enumerate(PROMPTS * 2):
        speculate = i % 4 != 3  # one request in four runs on the target alone
        request = GenerationRequest(tuple(tok.encode_prompt(text)), StopCriteria(max_new_tokens=24), request_id=f"r{i}")
        keep = Keep(k=4 if speculate else 0)
        timer = TokenTimer()
        metrics.request_started(speculate, "default" if speculate else "request_off")
        assert _v(sink, "trtspec_requests_speculating") == (1 if speculate else 0)
        gen = decoder.stream(request, metrics.wrap_policy(keep, request.request_id))
        for chunk in gen:
            timer.tokens(len(chunk.token_ids))
            chunks_with_tokens += bool(chunk.token_ids)
        metrics.request_finished(
            gen.result.stats, speculating=speculate, ttft_s=timer.ttft_s, itl_s=timer.itl_s, latency_s=timer.elapsed_s()
        )
        stats.append((speculate, gen.result.stats))
        outcomes += keep.outcomes
    assert _v(sink, "trtspec_requests_speculating") == 0

    total = lambda attr: sum(getattr(s, attr) for _, s in stats)  # noqa: E731
    assert total("drafted_tokens") > 0 and total("accepted_tokens") > 0
    assert _v(sink, "trtspec_drafted_tokens_total", drafter="model") == total("drafted_tokens")
    assert _v(sink, "trtspec_accepted_tokens_total", drafter="model") == total("accepted_tokens")
    assert _v(sink, "trtspec_tested_tokens_total", drafter="model") == sum(o.tested for o in outcomes)
    assert _v(sink, "trtspec_bonus_tokens_total") == total("bonus_tokens")
    assert _v(sink, "trtspec_emitted_tokens_total") == total("emitted_tokens")

    drafts = [o for o in outcomes if o.k > 0]
    rejected = [o for o in drafts if o.accepted < o.k]
    assert rejected, "the tiny draft should be rejected now and then"
    assert sink.total("trtspec_drafts_total") == len(drafts)
    assert sink.total("trtspec_rejections_total") == len(rejected)
    for bucket, n in Counter(M.length_bucket(o.context_len) for o in rejected).items():
        assert _v(sink, "trtspec_rejections_total", drafter="model", bucket=bucket) == n

    # per position (1-based labels) against the per-request SpecStats lists (0-based)
    drafted_at, accepted_at = Counter(), Counter()
    for _, s in stats:
        for i, n in enumerate(s.drafted_per_position):
            drafted_at[str(i + 1)] += n
        for i, n in enumerate(s.accepted_per_position):
            accepted_at[str(i + 1)] += n
    assert set(drafted_at) == {"1", "2", "3", "4"}
    for pos in drafted_at:
        assert _v(sink, "trtspec_drafted_tokens_by_position_total", drafter="model", position=pos) == drafted_at[pos]
        assert _v(sink, "trtspec_accepted_tokens_by_position_total", drafter="model", position=pos) == accepted_at[pos]
    # a prefix: position i+1 is never accepted more often than position i
    assert [accepted_at[str(i)] for i in range(1, 5)] == sorted((accepted_at[str(i)] for i in range(1, 5)), reverse=True)

    assert _v(sink, "trtspec_accepted_tokens_per_iteration_count") == len(drafts)
    assert _v(sink, "trtspec_accepted_tokens_per_iteration_sum") == total("accepted_tokens")
    assert _v(sink, "trtspec_draft_step_seconds_count") == len(drafts)
    assert _v(sink, "trtspec_target_step_seconds_count") == len(outcomes) - len(drafts)
    assert _v(sink, "trtspec_draft_step_seconds_sum") == pytest.approx(sum(o.draft_time_s for o in drafts))

    on = sum(1 for spec, _ in stats if spec)
    assert _v(sink, "trtspec_route_decisions_total", route="speculate", reason="default") == on
    assert _v(sink, "trtspec_route_decisions_total", route="target_only", reason="request_off") == len(stats) - on
    assert _v(sink, "trtspec_requests_total", outcome="ok") == len(stats)
    assert _v(sink, "trtspec_time_to_first_token_seconds_count", route="speculate") == on
    assert _v(sink, "trtspec_time_to_first_token_seconds_count", route="target_only") == len(stats) - on
    assert _v(sink, "trtspec_request_latency_seconds_count", route="target_only") == len(stats) - on
    itl = sink.total("trtspec_inter_token_latency_seconds_count")
    assert itl == chunks_with_tokens - len(stats)  # one per chunk after each request's first
    assert 1 <= _v(sink, "trtspec_draft_length") <= 4


def test_drafted_tested_and_accepted_tokens_are_counted_by_drafter(sink: PrometheusClientSink,
                                                                   metrics: SpecMetrics) -> None:
    metrics.iteration(dataclasses.replace(_outcome(4, 3), drafter="ngram"))
    metrics.iteration(dataclasses.replace(_outcome(2, 1), drafter="model"))
    metrics.iteration(dataclasses.replace(_outcome(5, 5), drafter="model"))
    metrics.iteration(dataclasses.replace(_outcome(3, 0), drafter="suffix"))
    drafters = ("model", "ngram", "suffix")
    assert [_v(sink, "trtspec_drafted_tokens_total", drafter=d) for d in drafters] == [7, 4, 3]
    # tested: the accepted positions and the first rejected one (none after a fully accepted draft)
    assert [_v(sink, "trtspec_tested_tokens_total", drafter=d) for d in drafters] == [2 + 5, 4, 1]
    assert [_v(sink, "trtspec_accepted_tokens_total", drafter=d) for d in drafters] == [6, 3, 0]


def test_k_choices_count_why_each_speculating_iteration_drafted_what_it_did(
    tiny_pair: ModelPair, sink: PrometheusClientSink, metrics: SpecMetrics
) -> None:
    """``trtspec_k_choices_total``: one per iteration of a speculating request, by drafter and the
    reason ``RequestControl.why`` gives (the goodput controller's own); none for a request that
    does not speculate. Agrees with the governor's ``k_choices`` (``trtspec status``)."""
    decoder = tiny_pair.decoder()
    tok = tiny_pair.target.tokenizer
    gov = SpeculationGovernor(Policy())
    asked = 0
    for i, text in enumerate(PROMPTS):
        request = GenerationRequest(tuple(tok.encode_prompt(text)), StopCriteria(max_new_tokens=16), request_id=f"r{i}")
        control = gov.decide(RequestInfo.from_request(request, speculation="off" if i == 3 else "auto"))
        result = decoder.generate(request, metrics.wrap_policy(control, request.request_id))
        control.finish()
        asked += (result.stats.iterations - 1) if control.speculate else 0  # no k is asked for the prefill
    choices = {f"{d}:{r}": sink.total("trtspec_k_choices_total", drafter=d, reason=r)
               for d, r in (why.split(":") for why in gov.snapshot().k_choices)}
    assert choices == gov.snapshot().k_choices and sum(choices.values()) == asked > 0
    assert sink.total("trtspec_k_choices_total") == asked and choices["model:best"] > 0


def test_exposition_names_match_the_table(sink: PrometheusClientSink, metrics: SpecMetrics) -> None:
    metrics.iteration(_outcome(3, 1))
    metrics.set_gauges(draft_memory_bytes=1, target_memory_bytes=2)
    text = sink.exposition()
    for spec in M.ALL:
        assert f"# TYPE {spec.name} {spec.kind.value}" in text, spec.name
        if spec in (M.ROUTE_DECISIONS, M.REQUESTS, M.K_CHOICES, M.DRAFT_LENGTH_CAP, M.ROLLING_REJECTION_RATE):
            continue  # nothing recorded for these yet
        assert any(line.startswith(name) for name in M.series_names(spec) for line in text.splitlines()), spec.name


def test_positions_past_fifteen_share_a_label(sink: PrometheusClientSink, metrics: SpecMetrics) -> None:
    metrics.iteration(_outcome(20, 17))
    m = {"drafter": "model"}
    assert _v(sink, "trtspec_drafted_tokens_by_position_total", position="15", **m) == 1
    assert _v(sink, "trtspec_drafted_tokens_by_position_total", position="16+", **m) == 5  # positions 16..20
    assert _v(sink, "trtspec_accepted_tokens_by_position_total", position="16+", **m) == 2  # 16, 17
    assert sink.value("trtspec_drafted_tokens_by_position_total", {"model": MODEL, "position": "17", **m}) is None


def test_positions_and_rejections_are_counted_by_drafter(sink: PrometheusClientSink, metrics: SpecMetrics) -> None:
    """What the dashboard shows of the draft model is the model's alone: a suffix draft rejected at its first
    token counts under its own drafter."""
    metrics.iteration(dataclasses.replace(_outcome(3, 3), drafter="model"), seq_len=10)
    metrics.iteration(dataclasses.replace(_outcome(4, 0), drafter="suffix"), seq_len=10)
    pos = lambda series, d: [_v(sink, series, drafter=d, position=p) for p in "123"]  # noqa: E731
    assert pos("trtspec_drafted_tokens_by_position_total", "model") == [1, 1, 1]
    assert pos("trtspec_accepted_tokens_by_position_total", "model") == [1, 1, 1]
    assert pos("trtspec_drafted_tokens_by_position_total", "suffix") == [1, 1, 1]
    assert pos("trtspec_accepted_tokens_by_position_total", "suffix") == [0, 0, 0]  # declared: read as 0
    assert [_v(sink, "trtspec_rejections_total", drafter=d, bucket="0-32") for d in ("model", "suffix")] == [0, 1]
    assert [_v(sink, "trtspec_drafts_total", drafter=d, bucket="0-32") for d in ("model", "suffix")] == [1, 1]


@pytest.mark.parametrize(
    ("seq_len", "bucket"),
    [(0, "0-32"), (31, "0-32"), (32, "32-64"), (127, "64-128"), (128, "128-256"), (511, "256-512"), (512, "512+"), (9000, "512+")],
)
def test_heatmap_buckets(sink: PrometheusClientSink, metrics: SpecMetrics, seq_len: int, bucket: str) -> None:
    metrics.iteration(_outcome(4, 1), seq_len=seq_len)
    metrics.iteration(_outcome(4, 4), seq_len=seq_len)  # fully accepted: a draft, not a rejection
    assert _v(sink, "trtspec_rejections_total", drafter="model", bucket=bucket) == 1
    assert _v(sink, "trtspec_drafts_total", drafter="model", bucket=bucket) == 2
    assert sink.total("trtspec_rejections_total") == 1


def test_fallbacks_and_outcomes(sink: PrometheusClientSink, metrics: SpecMetrics) -> None:
    s = SpecStats(draft_errors=1, emitted_tokens=3, time_to_first_token_s=0.5, total_time_s=0.9)
    metrics.request_started(True, "default")
    metrics.request_finished(s, speculating=True, fallbacks=2)
    metrics.request_started(True, "default")
    metrics.request_finished(SpecStats(), speculating=True, outcome="cancelled", latency_s=2.0)
    metrics.request_refused("invalid")
    assert _v(sink, "trtspec_fallbacks_total", reason="zero_acceptance") == 2
    assert _v(sink, "trtspec_fallbacks_total", reason="draft_error") == 1
    assert _v(sink, "trtspec_fallback_requests_total") == 1
    assert _v(sink, "trtspec_requests_total", outcome="invalid") == 1
    assert _v(sink, "trtspec_requests_total", outcome="cancelled") == 1
    # defaults from the loop's stats: TTFT 0.5 s, latency 0.9 s, mean ITL (0.9 - 0.5) / 2
    assert _v(sink, "trtspec_time_to_first_token_seconds_sum", route="speculate") == 0.5
    assert _v(sink, "trtspec_inter_token_latency_seconds_sum", route="speculate") == pytest.approx(0.2)
    assert _v(sink, "trtspec_request_latency_seconds_count", route="speculate") == 1  # not the cancelled one



def test_a_request_is_counted_after_everything_else_it_records() -> None:
    """A scrape that waits for N requests counted must find their latencies too (CI once saw a
    request counted without its TTFT: the count came first)."""
    calls: list[str] = []

    class Order(PrometheusClientSink):
        def inc(self, spec, labels, value=1.0):
            calls.append(spec.name)
            super().inc(spec, labels, value)

        def observe(self, spec, labels, value):
            calls.append(spec.name)
            super().observe(spec, labels, value)

    metrics = SpecMetrics(Order(), model=MODEL)
    metrics.request_started(True, "default")
    stats = SpecStats(draft_errors=1, emitted_tokens=3, time_to_first_token_s=0.5, total_time_s=0.9)
    metrics.request_finished(stats, speculating=True, fallbacks=1)
    assert {M.TTFT.name, M.ITL.name, M.REQUEST_LATENCY.name, M.FALLBACKS.name} <= set(calls)
    assert calls[-1] == M.REQUESTS.name and calls.count(M.REQUESTS.name) == 1


def test_breaker_transitions_through_the_listener(sink: PrometheusClientSink, metrics: SpecMetrics) -> None:
    clock = FakeClock(1000.0)
    breaker = CircuitBreaker(BreakerConfig(), clock, listeners=[metrics])
    state = lambda s: _v(sink, "trtspec_breaker_state", state=s)  # noqa: E731
    assert [state(s) for s in M.BREAKER_STATES] == [1, 0, 0, 0]
    for accepted in (0, 1) * 100:  # one-token drafts, half rejected: past the hard threshold
        breaker.observe(drafted=1, accepted=accepted)
    assert breaker.state is BreakerState.OPEN
    assert [state(s) for s in M.BREAKER_STATES] == [0, 0, 1, 0]
    assert _v(sink, "trtspec_breaker_transitions_total", from_state="closed", to_state="open") == 1
    assert _v(sink, "trtspec_rolling_rejection_rate") == 0.5
    clock.advance(BreakerConfig().cooldown_s)
    assert breaker.state is BreakerState.HALF_OPEN
    assert _v(sink, "trtspec_breaker_transitions_total", from_state="open", to_state="half_open") == 1
    assert state("half_open") == 1 and state("open") == 0
    # declared at zero from the start: every transition the breaker can make
    for old, new in M.BREAKER_STATE_CHANGES:
        assert sink.value("trtspec_breaker_transitions_total", {"model": MODEL, "from_state": old, "to_state": new}) is not None


def test_gauges_from_the_governor_snapshot(sink: PrometheusClientSink, metrics: SpecMetrics) -> None:
    clock = FakeClock(0.0)
    governor = SpeculationGovernor(Policy(), clock=clock, breaker_listeners=[metrics])
    metrics.set_gauges(governor.snapshot(), draft_memory_bytes=1_000, target_memory_bytes=9_000)
    assert _v(sink, "trtspec_draft_length_cap") == Policy().draft_length.k_max
    assert math.isnan(_v(sink, "trtspec_rolling_rejection_rate"))  # nothing drafted yet
    assert _v(sink, "trtspec_model_memory_bytes", role="draft") == 1_000
    assert _v(sink, "trtspec_model_memory_bytes", role="target") == 9_000
    with governor.decide(RequestInfo(request_id="a", context_tokens=100)) as control:
        assert control.speculate
        for _ in range(30):
            control.observe(_outcome(5, 0))  # everything rejected: the breaker opens
    metrics.set_gauges(governor.snapshot())
    assert _v(sink, "trtspec_draft_length_cap") == 0
    assert _v(sink, "trtspec_breaker_state", state="open") == 1
    assert _v(sink, "trtspec_rolling_rejection_rate") == 1.0


class _BrokenSink(PrometheusClientSink):
    def inc(self, spec, labels, value=1.0):  # type: ignore[no-untyped-def]
        raise RuntimeError("exporter down")


def test_a_failing_sink_never_raises() -> None:
    metrics = SpecMetrics(_BrokenSink(), model=MODEL)
    metrics.request_started(True, "default")
    metrics.iteration(_outcome(4, 2))
    metrics.request_finished(SpecStats(), speculating=True)
    assert metrics.errors == 3


def test_token_timer() -> None:
    clock = FakeClock(10.0)
    timer = TokenTimer(clock)
    clock.advance(0.3)
    timer.tokens(3)  # the first chunk: TTFT
    clock.advance(0.2)
    timer.tokens(0)  # text only: ignored
    timer.tokens(4)
    clock.advance(0.1)
    timer.tokens(1)
    assert timer.ttft_s == pytest.approx(0.3)
    assert timer.itl_s == pytest.approx([0.05, 0.1])
    assert timer.tokens_seen == 8
    assert timer.elapsed_s() == pytest.approx(0.6)


def test_triton_sink_emulates_histograms_without_buckets_support() -> None:
    """A pb_utils whose Metric() takes no buckets (older python backends; the project's FakeTriton):
    histograms become _bucket/_sum/_count counters that histogram_quantile reads the same way."""
    pb = FakeTriton()
    FakeTriton.MetricFamily.registry.clear()
    sink = TritonMetricSink(pb)
    metrics = SpecMetrics(sink, model=MODEL)
    metrics.iteration(_outcome(4, 2))
    metrics.iteration(_outcome(4, 4))
    registry = FakeTriton.MetricFamily.registry
    assert registry["trtspec_drafted_tokens_total"].metrics[0].value() == 8

    def series(name: str, **labels: str) -> float:
        want = {"model": MODEL, **labels}
        found = [m.value() for m in registry[name].metrics if m.labels == want]
        assert len(found) == 1, (name, labels)
        return found[0]

    # accepted per iteration: observations 2 and 4; cumulative buckets
    name = "trtspec_accepted_tokens_per_iteration"
    assert [series(f"{name}_bucket", le=le) for le in ("1", "2", "3", "4", "+Inf")] == [0, 1, 1, 2, 2]
    assert series(f"{name}_sum") == 6 and series(f"{name}_count") == 2
    assert series("trtspec_breaker_state", state="closed") == 1


class _Slow(PrometheusClientSink):
    """A sink whose calls wait for ``go`` (as a Triton metric call waits for the server), the first one failing."""

    def __init__(self) -> None:
        super().__init__()
        self.go = threading.Event()
        self.calls: list[str] = []

    def inc(self, spec, labels, value=1.0):
        self.go.wait(5)
        self.calls.append(spec.name)
        if len(self.calls) == 1:
            raise RuntimeError("the server refused it")
        super().inc(spec, labels, value)

    def observe(self, spec, labels, value):
        self.calls.append(spec.name)
        super().observe(spec, labels, value)


def test_a_queued_sink_answers_at_once_and_sends_everything_in_order() -> None:
    slow = _Slow()
    queued = QueuedSink(slow)
    metrics = SpecMetrics(queued, model=MODEL)
    stats = SpecStats(emitted_tokens=3, time_to_first_token_s=0.5, total_time_s=0.9)
    t0 = time.perf_counter()
    for _ in range(3):
        metrics.request_started(True, "default")
        metrics.iteration(_outcome(4, 2))
        metrics.request_finished(stats, speculating=True)
    assert time.perf_counter() - t0 < 1 and slow.calls == []  # the request's thread did not wait
    slow.go.set()
    assert queued.flush()
    assert metrics.errors == 0  # the refused call was the queue's to log, not the request's to fail
    assert slow.calls[-1] == M.REQUESTS.name and slow.calls.count(M.REQUESTS.name) == 3  # still counted last
    assert slow.total("trtspec_requests_total") == 3 and slow.total("trtspec_drafted_tokens_total") == 12
    assert slow.total("trtspec_route_decisions_total") == 2  # the first call (a route decision) was refused
    queued.inc(M.BONUS_TOKENS, {"model": MODEL})
    queued.close()
    assert slow.total("trtspec_bonus_tokens_total") == 1  # closing sends what was queued
