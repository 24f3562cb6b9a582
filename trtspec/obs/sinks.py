"""Exporters: where the recorder's numbers go. One small protocol, two sinks (and a queue).

- :class:`PrometheusClientSink`: a ``prometheus_client`` registry, for
  in-process runs and tests (serve it with ``prometheus_client.start_http_server(port, registry=sink.registry)``).
- :class:`TritonMetricSink`: Triton's custom metrics from the Python backend
  (``pb_utils.MetricFamily``); the series appear on Triton's metrics port
  (``--metrics-port``, default 8002) beside its own ``nv_*`` metrics.
- :class:`QueuedSink`: another sink's calls, made by a thread of its own
  (``spec_decode`` queues its Triton metrics: each is a round trip to the server).

Both expose exactly the families of :mod:`trtspec.obs.metrics`, so the same
PromQL reads either. For example, the rejection rate::

    1 - sum(rate(trtspec_accepted_tokens_total[5m])) / sum(rate(trtspec_drafted_tokens_total[5m]))

and the p99 time to first token with speculation on vs off::

    histogram_quantile(0.99, sum by (le, route) (rate(trtspec_time_to_first_token_seconds_bucket[5m])))
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Mapping
from typing import Any, Protocol

from trtspec.obs.metrics import ALL, Kind, MetricSpec

log = logging.getLogger("trtspec.obs")

Labels = Mapping[str, str]


class MetricSink(Protocol):
    """What the recorder writes to. ``labels`` must name exactly ``spec.labels``."""

    def declare(self, spec: MetricSpec, labels: Labels) -> None:
        """Make the series exist (at zero) before anything happens, so ``rate()`` has data from the start."""
        ...

    def inc(self, spec: MetricSpec, labels: Labels, value: float = 1.0) -> None:
        """Add ``value >= 0`` to a counter."""
        ...

    def set(self, spec: MetricSpec, labels: Labels, value: float) -> None:
        """Set a gauge."""
        ...

    def observe(self, spec: MetricSpec, labels: Labels, value: float) -> None:
        """Add one observation to a histogram."""
        ...


def label_values(spec: MetricSpec, labels: Labels) -> tuple[str, ...]:
    """``labels`` in ``spec.labels`` order; a missing or unknown label is a bug in the caller."""
    assert set(labels) == set(spec.labels), f"{spec.name}: labels {sorted(labels)} != {sorted(spec.labels)}"
    return tuple(str(labels[name]) for name in spec.labels)


class PrometheusClientSink:
    """Every family of the table in one ``prometheus_client`` registry (a fresh one unless given)."""

    def __init__(self, registry: Any = None) -> None:
        import prometheus_client as pc

        self.registry = registry if registry is not None else pc.CollectorRegistry()
        self._metrics: dict[str, Any] = {}
        for spec in ALL:
            # prometheus_client appends "_total" to counters itself.
            name = spec.name.removesuffix("_total") if spec.kind is Kind.COUNTER else spec.name
            if spec.kind is Kind.COUNTER:
                m = pc.Counter(name, spec.help, spec.labels, registry=self.registry)
            elif spec.kind is Kind.GAUGE:
                m = pc.Gauge(name, spec.help, spec.labels, registry=self.registry)
            else:
                m = pc.Histogram(name, spec.help, spec.labels, registry=self.registry, buckets=spec.buckets)
            self._metrics[spec.name] = m

    def _child(self, spec: MetricSpec, labels: Labels) -> Any:
        return self._metrics[spec.name].labels(*label_values(spec, labels))

    def declare(self, spec: MetricSpec, labels: Labels) -> None:
        self._child(spec, labels)

    def inc(self, spec: MetricSpec, labels: Labels, value: float = 1.0) -> None:
        assert spec.kind is Kind.COUNTER, spec.name
        self._child(spec, labels).inc(value)

    def set(self, spec: MetricSpec, labels: Labels, value: float) -> None:
        assert spec.kind is Kind.GAUGE, spec.name
        self._child(spec, labels).set(value)

    def observe(self, spec: MetricSpec, labels: Labels, value: float) -> None:
        assert spec.kind is Kind.HISTOGRAM, spec.name
        self._child(spec, labels).observe(value)

    # -- reading (tests, `trtspec generate --local`) -----------------------------

    def value(self, series: str, labels: Labels | None = None) -> float | None:
        """One sample by its exposed series name (``trtspec_drafted_tokens_total``, ``..._bucket``); None if absent."""
        return self.registry.get_sample_value(series, dict(labels or {}))

    def total(self, series: str, **match: str) -> float:
        """Sum of every sample of ``series`` whose labels include ``match``."""
        out = 0.0
        for family in self.registry.collect():
            for s in family.samples:
                if s.name == series and all(s.labels.get(k) == v for k, v in match.items()):
                    out += s.value
        return out

    def exposition(self) -> str:
        """The text a scrape of this registry returns."""
        import prometheus_client as pc

        return pc.generate_latest(self.registry).decode()


class TritonMetricSink:
    """Triton custom metrics through ``pb_utils`` (the ``triton_python_backend_utils`` module, injected).

    API used (Triton python_backend, 23.x onwards): ``pb_utils.MetricFamily(name=, description=, kind=)``
    with ``kind`` one of ``MetricFamily.COUNTER / GAUGE / HISTOGRAM``;
    ``family.Metric(labels={...})`` (histograms: ``Metric(labels=..., buckets=[...])``); then
    ``metric.increment(v)``, ``metric.set(v)``, ``metric.observe(v)``. Checked on Triton 2.51 (the
    ``nvidia-pytriton`` wheel): counters, gauges and histograms all appear on the metrics port.

    Histogram fallback: where ``MetricFamily`` has no ``HISTOGRAM`` kind, or ``Metric()`` takes no
    ``buckets`` (older python backends), a histogram is exported as three counter families
    ``<name>_bucket{le=...}`` (cumulative), ``<name>_sum`` and ``<name>_count``: the series a
    Prometheus histogram has, so the same ``histogram_quantile`` queries work; only the ``# TYPE``
    line differs. A warning says so once per family.

    Families and metrics are kept referenced for the sink's lifetime: the stub refuses to touch a
    metric whose family was collected. Thread-safe.
    """

    def __init__(self, pb: Any) -> None:
        self._pb = pb
        self._lock = threading.Lock()
        family = pb.MetricFamily
        self._kinds = {Kind.COUNTER: family.COUNTER, Kind.GAUGE: family.GAUGE}
        hist_kind = getattr(family, "HISTOGRAM", None)
        self.histograms_native = hist_kind is not None
        self._families: dict[str, Any] = {}
        self._metrics: dict[tuple[str, tuple[str, ...]], Any] = {}
        self._emulated: set[str] = set()  # histogram families exported as counters
        for spec in ALL:
            if spec.kind is Kind.HISTOGRAM:
                if hist_kind is None:
                    self._emulate(spec, "this python backend's MetricFamily has no HISTOGRAM kind")
                else:
                    self._families[spec.name] = family(name=spec.name, description=spec.help, kind=hist_kind)
            else:
                self._families[spec.name] = family(name=spec.name, description=spec.help, kind=self._kinds[spec.kind])

    def _emulate(self, spec: MetricSpec, why: str) -> None:
        log.warning("%s: exported as _bucket/_sum/_count counters (%s)", spec.name, why)
        family = self._pb.MetricFamily
        for suffix in ("_bucket", "_sum", "_count"):
            key = spec.name + suffix
            if key not in self._families:
                self._families[key] = family(name=key, description=spec.help, kind=family.COUNTER)
        self._emulated.add(spec.name)

    def _metric(self, family_name: str, names: tuple[str, ...], values: tuple[str, ...], buckets: Any = None) -> Any:
        key = (family_name, values)
        m = self._metrics.get(key)
        if m is None:
            labels = dict(zip(names, values))
            family = self._families[family_name]
            m = family.Metric(labels=labels) if buckets is None else family.Metric(labels=labels, buckets=buckets)
            self._metrics[key] = m
        return m

    def _hist_metric(self, spec: MetricSpec, values: tuple[str, ...]) -> Any:
        """The native histogram metric, or None once the family is emulated. Caller holds the lock."""
        if spec.name in self._emulated:
            return None
        try:
            return self._metric(spec.name, spec.labels, values, list(spec.buckets))
        except TypeError as e:  # Metric() without a buckets argument
            self._emulate(spec, f"Metric() refused buckets: {e}")
            return None

    def _emulated_observe(self, spec: MetricSpec, values: tuple[str, ...], value: float | None) -> None:
        names = (*spec.labels, "le")
        bounds = [*(_le(b) for b in spec.buckets), "+Inf"]
        for bound, le in zip([*spec.buckets, float("inf")], bounds):
            m = self._metric(spec.name + "_bucket", names, (*values, le))
            if value is not None and value <= bound:
                m.increment(1.0)
        s = self._metric(spec.name + "_sum", spec.labels, values)
        c = self._metric(spec.name + "_count", spec.labels, values)
        if value is not None:
            s.increment(float(value))
            c.increment(1.0)

    def declare(self, spec: MetricSpec, labels: Labels) -> None:
        values = label_values(spec, labels)
        with self._lock:
            if spec.kind is Kind.HISTOGRAM:
                if self._hist_metric(spec, values) is None:
                    self._emulated_observe(spec, values, None)
            else:
                self._metric(spec.name, spec.labels, values)

    def inc(self, spec: MetricSpec, labels: Labels, value: float = 1.0) -> None:
        assert spec.kind is Kind.COUNTER, spec.name
        values = label_values(spec, labels)
        with self._lock:
            self._metric(spec.name, spec.labels, values).increment(float(value))

    def set(self, spec: MetricSpec, labels: Labels, value: float) -> None:
        assert spec.kind is Kind.GAUGE, spec.name
        values = label_values(spec, labels)
        with self._lock:
            self._metric(spec.name, spec.labels, values).set(float(value))

    def observe(self, spec: MetricSpec, labels: Labels, value: float) -> None:
        assert spec.kind is Kind.HISTOGRAM, spec.name
        values = label_values(spec, labels)
        with self._lock:
            m = self._hist_metric(spec, values)
            if m is not None:
                m.observe(float(value))
            else:
                self._emulated_observe(spec, values, value)


def _le(bound: float) -> str:
    """A bucket bound as Prometheus writes ``le`` (``0.5``, ``1``, ``+Inf``)."""
    return f"{bound:g}" if bound != float("inf") else "+Inf"


class QueuedSink:
    """Another sink's calls, made in the order they came by one thread of its own.

    A metric call from a Python backend model is a round trip to the server
    (40-90 us each on a 2-core EPYC) and ``spec_decode`` makes about 20 per
    speculative iteration: queued, they cost the request's thread a put. The order
    is kept, so what :class:`~trtspec.obs.recorder.SpecMetrics` records last for a
    request (its count) is still sent last. :meth:`flush` waits for what was queued.
    """

    def __init__(self, inner: MetricSink) -> None:
        self.inner = inner
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._send, name="trtspec-metrics", daemon=True)
        self._thread.start()

    def declare(self, spec: MetricSpec, labels: Labels) -> None:
        self._queue.put((self.inner.declare, spec, labels))

    def inc(self, spec: MetricSpec, labels: Labels, value: float = 1.0) -> None:
        self._queue.put((self.inner.inc, spec, labels, value))

    def set(self, spec: MetricSpec, labels: Labels, value: float) -> None:
        self._queue.put((self.inner.set, spec, labels, value))

    def observe(self, spec: MetricSpec, labels: Labels, value: float) -> None:
        self._queue.put((self.inner.observe, spec, labels, value))

    def flush(self, timeout_s: float = 5.0) -> bool:
        """Wait until everything queued so far was sent; False if that took over ``timeout_s``."""
        done = threading.Event()
        self._queue.put((done.set,))
        return done.wait(timeout_s)

    def close(self, timeout_s: float = 5.0) -> None:
        """Send what is queued, then stop the thread."""
        self._queue.put(None)
        self._thread.join(timeout_s)

    def _send(self) -> None:
        while (call := self._queue.get()) is not None:
            fn, *args = call
            try:
                fn(*args)
            except Exception:  # a metric must never stop the metrics after it
                log.exception("metric call %s failed", getattr(fn, "__name__", fn))
