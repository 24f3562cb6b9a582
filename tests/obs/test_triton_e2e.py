"""End to end on a real tritonserver: SpecMetrics -> TritonMetricSink -> Triton's metrics port -> a real Prometheus.

The server runs the tiny ``draft`` and ``target`` models and ``obs_probe``
(``triton_probe_model.py``: the governor, the real loop over BLS, and the
recorder, as ``spec_decode`` will run them). Checked:

- after a known set of requests the values on ``/metrics`` agree with the
  per-request outputs (drafted, accepted, bonus, emitted tokens; requests by
  route; one TTFT observation per request), and histograms are native;
- a real Prometheus scraping the metrics port under traffic returns data (and
  a number) for every expression in the alert rules and the dashboard, and
  loads the generated rules file without errors.
"""

from __future__ import annotations

import json
import time
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from trtspec.build.repo import render_pbtxt, write_model_repo
from trtspec.obs.dashboard import dashboard, dashboard_expressions
from trtspec.obs.rules import AlertConfig, alert_rules, signals, write_monitoring
from trtspec.runtime.tokenizer import Tokenizer
from trtspec.serving.launcher import ServerError, TritonServer, find_tritonserver

PROBE = "obs_probe"
PROMPTS = ["The quick brown fox", "Hello world! How are", "def f(x): return", "Numbers 0 1 2 3"]
POLICY = "draft_length:\n  controller: static\n  static:\n    k: 4\n"
# (priority, speculation) -> the route the default policy gives a short prompt
KINDS = [("normal", "auto"), ("normal", "auto"), ("high", "auto"), ("normal", "off")]


def _probe_config(tiny_target: Path, tiny_draft: Path, policy: Path) -> dict:
    params = {
        "vocab_size": str(Tokenizer.from_dir(tiny_target).vocab_size),
        "max_context": "256",
        "policy_file": str(policy),
        "target_weights": str(tiny_target / "model.safetensors"),
        "draft_weights": str(tiny_draft / "model.safetensors"),
    }
    return {
        "name": PROBE,
        "backend": "python",
        "max_batch_size": 0,
        "input": [{"name": "request", "data_type": "TYPE_STRING", "dims": [1]}],
        "output": [{"name": "result", "data_type": "TYPE_STRING", "dims": [1]}],
        "instance_group": [{"count": 1, "kind": "KIND_CPU"}],
        "parameters": {k: {"string_value": v} for k, v in params.items()},
    }


@pytest.fixture(scope="module")
def probe_server(tmp_path_factory: pytest.TempPathFactory, tiny_target: Path, tiny_draft: Path) -> Iterator[TritonServer]:
    try:
        install = find_tritonserver()
    except ServerError as e:
        pytest.skip(str(e))
    work = tmp_path_factory.mktemp("obs_triton")
    repo = write_model_repo(work / "repo", target_checkpoint=tiny_target, draft_checkpoint=tiny_draft, max_sessions=16)
    for p in sorted((repo / "spec_decode").rglob("*"), reverse=True):  # the probe stands in for spec_decode
        p.unlink() if p.is_file() else p.rmdir()
    (repo / "spec_decode").rmdir()
    policy = work / "policy.yaml"
    policy.write_text(POLICY)
    (repo / PROBE / "1").mkdir(parents=True)
    (repo / PROBE / "config.pbtxt").write_text(render_pbtxt(_probe_config(tiny_target, tiny_draft, policy)))
    (repo / PROBE / "1" / "model.py").write_text((Path(__file__).parent / "triton_probe_model.py").read_text())
    server = TritonServer(repo, log_file=work / "tritonserver.log", install=install)
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def send(probe_server: TritonServer, tiny_target: Path) -> Callable[[int, int], list[dict]]:
    """``send(n, max_tokens)``: n requests (cycling through prompts and route kinds); their results."""
    assert probe_server.endpoints is not None
    url = f"http://{probe_server.endpoints.http}/v2/models/{PROBE}/infer"
    tok = Tokenizer.from_dir(tiny_target)
    counter = iter(range(10**6))

    def one(i: int, max_tokens: int) -> dict:
        priority, speculation = KINDS[i % len(KINDS)]
        request = {
            "prompt_ids": tok.encode_prompt(PROMPTS[i % len(PROMPTS)]),
            "max_tokens": max_tokens,
            "priority": priority,
            "speculation": speculation,
            "request_id": f"req-{i}",
        }
        body = {"inputs": [{"name": "request", "shape": [1], "datatype": "BYTES", "data": [json.dumps(request)]}]}
        http = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
        with urllib.request.urlopen(http, timeout=120) as r:
            return json.loads(json.loads(r.read())["outputs"][0]["data"][0])

    def run(n: int, max_tokens: int) -> list[dict]:
        return [one(next(counter), max_tokens) for _ in range(n)]

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


def test_metrics_port_agrees_with_per_request_outputs(probe_server: TritonServer, send) -> None:
    before = _scrape(probe_server)
    results = send(8, 24)
    after = _scrape(probe_server)
    delta = lambda name, **m: _sum(after, name, **m) - _sum(before, name, **m)  # noqa: E731

    stats = [r["stats"] for r in results]
    total = lambda key: sum(s[key] for s in stats)  # noqa: E731
    assert total("drafted_tokens") > 0 and total("accepted_tokens") > 0
    assert delta("trtspec_drafted_tokens_total", model=PROBE) == total("drafted_tokens")
    assert delta("trtspec_accepted_tokens_total", model=PROBE) == total("accepted_tokens")
    assert delta("trtspec_bonus_tokens_total", model=PROBE) == total("bonus_tokens")
    assert delta("trtspec_emitted_tokens_total", model=PROBE) == total("emitted_tokens")
    drafted_at = Counter()
    for s in stats:
        for i, n in enumerate(s["drafted_per_position"]):
            drafted_at[str(i + 1)] += n
    for pos, n in drafted_at.items():
        assert delta("trtspec_drafted_tokens_by_position_total", position=pos) == n

    routes = Counter((r["speculate"], r["reason"]) for r in results)
    assert routes == {(True, "default"): 4, (False, "high_priority"): 2, (False, "request_off"): 2}
    assert delta("trtspec_route_decisions_total", route="speculate", reason="default") == 4
    assert delta("trtspec_route_decisions_total", route="target_only", reason="high_priority") == 2
    assert delta("trtspec_route_decisions_total", route="target_only", reason="request_off") == 2
    # native Triton histograms (not the counter emulation): one TTFT observation per request, by route
    text = _metrics_text(probe_server)
    for name in ("trtspec_time_to_first_token_seconds", "trtspec_inter_token_latency_seconds", "trtspec_draft_step_seconds"):
        assert f"# TYPE {name} histogram" in text
    assert delta("trtspec_time_to_first_token_seconds_count", route="speculate") == 4
    assert delta("trtspec_time_to_first_token_seconds_count", route="target_only") == 4
    assert delta("trtspec_time_to_first_token_seconds_bucket", route="speculate", le="+Inf") == 4
    assert _sum(after, "trtspec_requests_speculating") == 0
    assert _sum(after, "trtspec_breaker_state", state="closed") == 1
    assert _sum(after, "trtspec_model_memory_bytes", role="target") > 0
    assert _sum(after, "nv_cpu_utilization") >= 0 and any(n.startswith("nv_") for n, _ in after)  # Triton's own beside ours


def test_prometheus_scrapes_triton_and_every_expression_has_data(
    probe_server: TritonServer, send, start_prometheus, tmp_path: Path
) -> None:
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
    drafted = sum(r["stats"]["drafted_tokens"] for r in results)
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
