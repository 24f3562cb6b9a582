"""In-process: the real loop (tiny models) and governor -> SpecMetrics -> PrometheusClientSink, served by
prometheus_client's HTTP server and scraped by a real Prometheus. Every expression of the rules and the
dashboard returns a number, and Prometheus' counters equal the loop's."""

from __future__ import annotations

import time
from collections.abc import Iterator

import prometheus_client
import pytest

from trtspec.control import RequestInfo, SpeculationGovernor, parse_policy
from trtspec.obs.dashboard import dashboard, dashboard_expressions
from trtspec.obs.recorder import SpecMetrics, TokenTimer
from trtspec.obs.rules import signals
from trtspec.obs.sinks import PrometheusClientSink
from trtspec.runtime.pair import ModelPair
from trtspec.serving.launcher import free_port
from trtspec.decoding import GenerationRequest, StopCriteria

PROMPTS = ["The quick brown fox", "Hello world! How are", "def f(x): return", "Numbers 0 1 2 3"]
KINDS = [("normal", "auto"), ("high", "auto"), ("normal", "off"), ("normal", "auto")]


@pytest.fixture
def served() -> Iterator[tuple[PrometheusClientSink, str]]:
    sink = PrometheusClientSink()
    port = free_port()
    server, thread = prometheus_client.start_http_server(port, addr="127.0.0.1", registry=sink.registry)
    try:
        yield sink, f"127.0.0.1:{port}"
    finally:
        server.shutdown()
        thread.join(5)


def test_real_prometheus_reads_every_expression(tiny_pair: ModelPair, served, start_prometheus) -> None:
    sink, target = served
    metrics = SpecMetrics(sink, model="inproc")
    policy = parse_policy({"draft_length": {"controller": "static", "static": {"k": 4}}})
    governor = SpeculationGovernor(policy, breaker_listeners=[metrics])
    decoder, tok = tiny_pair.decoder(), tiny_pair.target.tokenizer
    prom = start_prometheus([target])
    up = prom.wait_for("up", lambda r: bool(r) and r[0]["value"][1] == "1")
    assert up and up[0]["value"][1] == "1", f"Prometheus never scraped {target}"

    drafted = 0
    i = 0
    deadline = time.monotonic() + 3.0  # traffic across several 1 s scrapes
    while time.monotonic() < deadline or i < 8:
        priority, speculation = KINDS[i % len(KINDS)]
        req = GenerationRequest(tuple(tok.encode_prompt(PROMPTS[i % 4])), StopCriteria(max_new_tokens=16), request_id=f"r{i}")
        timer = TokenTimer()
        with governor.decide(RequestInfo.from_request(req, priority=priority, speculation=speculation)) as control:
            metrics.request_started(control.speculate, control.reason)
            gen = decoder.stream(req, metrics.wrap_policy(control, req.request_id))
            for chunk in gen:
                timer.tokens(len(chunk.token_ids))
            metrics.request_finished(
                gen.result.stats, speculating=control.speculate, ttft_s=timer.ttft_s, itl_s=timer.itl_s,
                latency_s=timer.elapsed_s(), fallbacks=control.fallback.fallbacks,
            )
        metrics.set_gauges(governor.snapshot(), draft_memory_bytes=tiny_pair.draft.weight_bytes,
                           target_memory_bytes=tiny_pair.target.weight_bytes)
        drafted += gen.result.stats.drafted_tokens
        i += 1
    assert drafted > 0 and metrics.errors == 0
    seen = prom.wait_for("sum(trtspec_drafted_tokens_total)", lambda r: bool(r) and float(r[0]["value"][1]) == drafted)
    assert seen and float(seen[0]["value"][1]) == drafted

    exprs = {f"signal {n}": e for n, e in signals().items()}
    exprs |= {f"dashboard {j}: {e}": e for j, e in enumerate(dashboard_expressions(dashboard()))}
    empty = {label for label, e in exprs.items() if not prom.has_number(prom.query(e))}
    assert empty == set(), "expressions without data:\n" + "\n".join(sorted(empty))
    routes = {s["metric"]["route"] for s in prom.query("sum by (route) (rate(trtspec_route_decisions_total[1m]))")}
    assert routes == {"speculate", "target_only"}
