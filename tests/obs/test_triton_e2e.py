"""End to end on a real tritonserver: spec_decode's SpecMetrics -> TritonMetricSink ->
Triton's metrics port -> a real Prometheus.

The shared tiny-model server (``triton`` in tests/conftest.py) runs ``spec_decode``
with the governor, the loop over BLS and the recorder. Checked:

- after a known set of requests the values on ``/metrics`` agree with the
  per-request outputs (drafted, accepted and emitted tokens; requests by route
  and reason; one TTFT observation per request), histograms are native, and the
  draft/target memory gauges are set;
- a real Prometheus scraping the metrics port under traffic returns data (and
  a number) for every expression in the alert rules and the dashboard, and
  loads the generated rules file without errors.
"""

from __future__ import annotations

import time
import urllib.request
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from trtspec.obs.dashboard import dashboard, dashboard_expressions
from trtspec.obs.monitoring import write_monitoring
from trtspec.obs.rules import AlertConfig, alert_rules, signals
from trtspec.serving.client import ClientResult, GenerateParams, generate
from trtspec.serving.launcher import TritonServer

MODEL = "spec_decode"
PROMPTS = ["The quick brown fox", "Hello world! How are", "def f(x): return", "Numbers 0 1 2 3"]
# (priority, speculation) -> the route the default routing rules give a short prompt
KINDS = [("normal", "auto"), ("normal", "auto"), ("high", "auto"), ("normal", "off")]
ROUTES = {("normal", "auto"): ("speculate", "default"), ("high", "auto"): ("target_only", "high_priority"),
          ("normal", "off"): ("target_only", "request_off")}


@pytest.fixture(scope="module")
def send(triton: TritonServer) -> Callable[[int, int], list[tuple[tuple[str, str], ClientResult]]]:
    """``send(n, max_tokens)``: n requests over gRPC (cycling through prompts and route kinds)."""
    assert triton.endpoints is not None
    url = triton.endpoints.grpc
    counter = iter(range(10**6))

    def run(n: int, max_tokens: int) -> list[tuple[tuple[str, str], ClientResult]]:
        out = []
        for _ in range(n):
            i = next(counter)
            priority, speculation = KINDS[i % len(KINDS)]
            params = GenerateParams(max_tokens=max_tokens, priority=priority, speculation=speculation)
            out.append(((priority, speculation), generate(url, PROMPTS[i % len(PROMPTS)], params)))
        return out

    return run


def _metrics_text(server: TritonServer) -> str:
    assert server.endpoints is not None
    with urllib.request.urlopen(server.endpoints.metrics_url, timeout=10) as r:
        return r.read().decode()


def _scrape(server: TritonServer) -> dict[tuple[str, tuple], float]:
    """Every sample on the metrics port: (name, sorted labels) -> value."""
    out = {}
    for family in text_string_to_metric_families(_metrics_text(server)):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def _sum(samples: dict, name: str, **match: str) -> float:
    return sum(v for (n, labels), v in samples.items() if n == name and all((k, v2) in labels for k, v2 in match.items()))


def _scrape_once_finished(server: TritonServer, before: dict, requests: int, timeout_s: float = 10.0) -> dict:
    """The metrics once ``requests`` more requests were recorded as finished: a request's
    outcome is recorded just AFTER its final response is sent, so a scrape right after the
    client's last answer can miss the last one (seen in CI: 7 of 8)."""
    deadline = time.monotonic() + timeout_s
    while True:
        after = _scrape(server)
        done = _sum(after, "trtspec_requests_total", model=MODEL) - _sum(before, "trtspec_requests_total", model=MODEL)
        if done >= requests or time.monotonic() > deadline:
            return after
        time.sleep(0.05)


def test_metrics_port_agrees_with_per_request_outputs(triton: TritonServer, send) -> None:
    before = _scrape(triton)
    results = send(8, 24)
    after = _scrape_once_finished(triton, before, len(results))
    delta = lambda name, **m: _sum(after, name, **m) - _sum(before, name, **m)  # noqa: E731

    total = lambda key: sum(getattr(r, key) for _, r in results)  # noqa: E731
    assert total("num_draft_tokens") > 0 and total("num_accepted_tokens") > 0
    assert delta("trtspec_drafted_tokens_total", model=MODEL) == total("num_draft_tokens")
    assert delta("trtspec_accepted_tokens_total", model=MODEL) == total("num_accepted_tokens")
    assert delta("trtspec_emitted_tokens_total", model=MODEL) == total("num_output_tokens")
    assert delta("trtspec_requests_total", model=MODEL, outcome="ok") == len(results)
    # accepted by position: never more than drafted at that position, and position 1 is drafted every iteration
    assert delta("trtspec_drafted_tokens_by_position_total", position="1") > 0
    for pos in ("1", "2", "3"):
        assert 0 <= delta("trtspec_accepted_tokens_by_position_total", position=pos) <= delta(
            "trtspec_drafted_tokens_by_position_total", position=pos
        )

    routes = Counter(ROUTES[kind] for kind, _ in results)
    assert routes == {("speculate", "default"): 4, ("target_only", "high_priority"): 2, ("target_only", "request_off"): 2}
    for (route, reason), n in routes.items():
        assert delta("trtspec_route_decisions_total", route=route, reason=reason) == n
    # every k a speculating request chose is counted with its reason (the static controller gives none)
    chosen = delta("trtspec_k_choices_total", drafter="model", reason="controller")
    assert chosen >= delta("trtspec_drafts_total") > 0 and delta("trtspec_k_choices_total") == chosen
    for kind, r in results:  # target-only requests draft nothing
        assert (r.num_draft_tokens > 0) == (ROUTES[kind][0] == "speculate")
    # native Triton histograms (not the counter emulation): one TTFT observation per request, by route
    text = _metrics_text(triton)
    for name in ("trtspec_time_to_first_token_seconds", "trtspec_inter_token_latency_seconds", "trtspec_draft_step_seconds"):
        assert f"# TYPE {name} histogram" in text
    assert delta("trtspec_time_to_first_token_seconds_count", route="speculate") == 4
    assert delta("trtspec_time_to_first_token_seconds_count", route="target_only") == 4
    assert delta("trtspec_time_to_first_token_seconds_bucket", route="speculate", le="+Inf") == 4
    assert _sum(after, "trtspec_requests_speculating") == 0
    assert _sum(after, "trtspec_breaker_state", state="closed") == 1
    assert _sum(after, "trtspec_model_memory_bytes", role="target") > 0
    assert _sum(after, "trtspec_model_memory_bytes", role="draft") > 0
    assert _sum(after, "nv_cpu_utilization") >= 0 and any(n.startswith("nv_") for n, _ in after)  # Triton's own beside ours


def test_prometheus_scrapes_triton_and_every_expression_has_data(
    triton: TritonServer, send, start_prometheus, tmp_path: Path
) -> None:
    probe_server = triton
    assert probe_server.endpoints is not None
    files = write_monitoring(tmp_path / "monitoring", AlertConfig())
    target = f"127.0.0.1:{probe_server.endpoints.metrics_port}"
    prom = start_prometheus([target], rule_files=[files["rules"]])
    up = prom.wait_for("up", lambda r: bool(r) and r[0]["value"][1] == "1")
    assert up and up[0]["value"][1] == "1", f"Prometheus never scraped {target}: {up}"

    results = []
    deadline = time.monotonic() + 4.0  # traffic across several 1 s scrapes, so rates are not zero
    while time.monotonic() < deadline or len(results) < 8:
        results += send(4, 12)
    drafted = sum(r.num_draft_tokens for _, r in results)
    assert drafted > 0
    final = _sum(_scrape(probe_server), "trtspec_drafted_tokens_total")
    seen = prom.wait_for("sum(trtspec_drafted_tokens_total)", lambda r: bool(r) and float(r[0]["value"][1]) == final)
    assert seen and float(seen[0]["value"][1]) == final, "Prometheus did not scrape the final counters"

    exprs = {f"signal {name}": e for name, e in signals().items()}
    exprs |= {f"dashboard {i}: {e}": e for i, e in enumerate(dashboard_expressions(dashboard()))}
    empty = {label: e for label, e in exprs.items() if not prom.has_number(prom.query(e))}
    assert empty == {}, "expressions without data:\n" + "\n".join(empty)
    # the rejection rate Prometheus computes is the one the requests report
    rate = float(prom.query(signals()["rejection_rate_warn"])[0]["value"][1])
    assert 0.0 <= rate < 1.0

    rules = [r for g in prom.api("rules")["groups"] for r in g["rules"]]
    assert {r["name"] for r in rules} == {r["alert"] for r in alert_rules()["groups"][0]["rules"]}
    deadline = time.monotonic() + 10
    while any(r.get("health") != "ok" for r in rules) and time.monotonic() < deadline:
        time.sleep(0.5)
        rules = [r for g in prom.api("rules")["groups"] for r in g["rules"]]
    assert all(r["health"] == "ok" for r in rules), rules
