"""Observability: metrics, alert rules, the Grafana dashboard, rejection traces, profiling.

Three layers (STYLE item 7): the loop's own stats (``IterationOutcome``,
``SpecStats`` in :mod:`trtspec.decoding.types`); the recorder :class:`SpecMetrics`
(:mod:`trtspec.obs.recorder`); and the sinks behind :class:`MetricSink`
(:mod:`trtspec.obs.sinks`): Triton custom metrics and ``prometheus_client``.
Every metric is defined once, in :mod:`trtspec.obs.metrics`; the rules
(:mod:`trtspec.obs.rules`) and the dashboard (:mod:`trtspec.obs.dashboard`)
are generated from it. ``docs/observability.md`` is the operator's guide.

Names are imported lazily so that ``trtspec monitoring rules`` does not load torch.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "SpecMetrics": "trtspec.obs.recorder",
    "MeteredPolicy": "trtspec.obs.recorder",
    "TokenTimer": "trtspec.obs.recorder",
    "MetricSink": "trtspec.obs.sinks",
    "PrometheusClientSink": "trtspec.obs.sinks",
    "TritonMetricSink": "trtspec.obs.sinks",
    "QueuedSink": "trtspec.obs.sinks",
    "RejectionTracer": "trtspec.obs.trace",
    "IterationProfiler": "trtspec.obs.profiling",
    "AlertConfig": "trtspec.obs.rules",
    "write_monitoring": "trtspec.obs.monitoring",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'trtspec.obs' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
