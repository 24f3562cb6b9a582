"""The OpenAI proxy's own metrics (prometheus_client, served on its ``/metrics``).

They measure the proxy as its clients see it; what happens inside Triton is on
Triton's metrics port (``trtspec_requests_total``, ...). PromQL:

- request rate by outcome: ``sum by (outcome) (rate(trtspec_openai_requests_total[5m]))`` (requests refused
  before their route, a body that does not parse or no API key, count too; a path not ours as ``other``)
- p95 latency: ``histogram_quantile(0.95, sum by (le) (rate(trtspec_openai_request_duration_seconds_bucket[5m])))``
- p95 time to first token: the same on ``trtspec_openai_time_to_first_token_seconds_bucket``
- in flight: ``trtspec_openai_requests_in_flight``
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
# outcome: ok | invalid | cancelled | unavailable | error (the words of trtspec_requests_total), and the
# endpoint's own unauthorized (no API key, or a wrong one); any other 4xx is invalid
OUTCOME_BY_STATUS = {200: "ok", 401: "unauthorized", 499: "cancelled", 503: "unavailable"}
ENDPOINTS = ("/v1/chat/completions", "/v1/completions")  # labels of their own; any other path is "other"


def outcome(status: int) -> str:
    return OUTCOME_BY_STATUS.get(status) or ("invalid" if 400 <= status < 500 else "error")


class ProxyMetrics:
    """Counters and histograms of one proxy, in a registry of its own (several proxies may share a process)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter("trtspec_openai_requests", "OpenAI endpoint requests by endpoint and outcome",
                                ["endpoint", "outcome"], registry=self.registry)
        self.duration = Histogram("trtspec_openai_request_duration_seconds", "request received -> last byte sent",
                                  ["endpoint"], buckets=_LATENCY_BUCKETS, registry=self.registry)
        self.ttft = Histogram("trtspec_openai_time_to_first_token_seconds", "request received -> first text sent",
                              ["endpoint"], buckets=_LATENCY_BUCKETS, registry=self.registry)
        self.in_flight = Gauge("trtspec_openai_requests_in_flight", "requests being answered",
                               registry=self.registry)

    def finished(self, endpoint: str, status: int, duration_s: float, ttft_s: float | None) -> None:
        self.requests.labels(endpoint, outcome(status)).inc()
        self.duration.labels(endpoint).observe(duration_s)
        if ttft_s is not None:
            self.ttft.labels(endpoint).observe(ttft_s)

    def refused(self, path: str, status: int) -> None:
        """A request refused before it was answered (a body that does not parse, no route, no API key):
        counted by outcome, its latency not observed. A path not ours counts as ``other`` (no label per
        path a client makes up)."""
        self.requests.labels(path if path in ENDPOINTS else "other", outcome(status)).inc()

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
