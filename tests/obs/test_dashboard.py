"""The dashboard and the metric table: the CLI output, the names every expression uses, PromQL syntax
(checked by the real promtool), and the panels operators asked for."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import yaml
from typer.testing import CliRunner

from trtspec.cli.monitoring import app
from trtspec.obs import metrics as M
from trtspec.obs.dashboard import dashboard, dashboard_expressions
from trtspec.obs.rules import alert_rules, rule_expressions, signals

runner = CliRunner()
NAME = re.compile(r"\btrtspec_[a-z_]+\b")
ALLOWED_LABELS = {"model", "route", "reason", "outcome", "position", "bucket", "state", "from_state", "to_state", "role",
                  "drafter"}


def _all_expressions() -> list[str]:
    return dashboard_expressions(dashboard()) + rule_expressions(alert_rules()) + list(signals().values())


def test_cli_dashboard_is_grafana_json() -> None:
    result = runner.invoke(app, ["dashboard", "--slo-ttft-ms", "700"])
    assert result.exit_code == 0, result.output
    d = json.loads(result.stdout)
    assert d["title"] and d["uid"] and d["schemaVersion"] >= 30
    ids = [p["id"] for p in d["panels"]]
    assert len(ids) == len(set(ids))
    for p in d["panels"]:
        assert p["targets"] and set(p["gridPos"]) == {"x", "y", "w", "h"}
        assert p["datasource"]["uid"] == "${datasource}"
    ttft = next(p for p in d["panels"] if p["title"].startswith("Time to first token"))
    assert ttft["fieldConfig"]["defaults"]["thresholds"]["steps"][1]["value"] == 0.7


def test_the_panels_operators_asked_for() -> None:
    panels = {p["title"]: p for p in dashboard()["panels"]}
    exprs = lambda title: " ".join(t["expr"] for t in panels[title]["targets"])  # noqa: E731
    assert M.rejection_rate_expr("5m") in exprs("Acceptance and rejection rate")
    model = '{drafter="model"}'  # the draft model's, as the alerts: free drafters' rejections cost nothing
    assert f"sum by (position) (rate(trtspec_accepted_tokens_by_position_total{model}[5m]))" in exprs(
        "Acceptance by draft position")
    heatmap = panels["Rejection heatmap: sequence length x time"]
    assert heatmap["type"] == "heatmap"
    assert f"sum by (bucket) (increase(trtspec_rejections_total{model}[5m]))" in exprs(heatmap["title"])
    assert "trtspec_draft_length" in exprs("Draft length")
    assert "trtspec_breaker_state" in exprs("Breaker state")
    for title, spec in [
        ("Time to first token p50 / p99: speculation on vs off", M.TTFT),
        ("Inter-token latency p50 / p99: speculation on vs off", M.ITL),
    ]:
        assert [t["expr"] for t in panels[title]["targets"]] == [
            M.quantile_expr(0.5, spec, "5m", ("route",)),
            M.quantile_expr(0.99, spec, "5m", ("route",)),
        ]
    assert "trtspec_emitted_tokens_total" in exprs("Throughput")
    assert "trtspec_model_memory_bytes" in exprs("Memory: draft and target")


def test_every_name_used_is_in_the_table() -> None:
    known = {name for spec in M.ALL for name in M.series_names(spec)}
    used = {name for expr in _all_expressions() for name in NAME.findall(expr)}
    assert used - known == set()
    # and every family is read by the dashboard or the rules
    unread = {spec.name for spec in M.ALL if not any(n in used for n in M.series_names(spec))}
    assert unread == set()


def test_every_expression_parses(tmp_path: Path, promtool: str) -> None:
    """promtool parses each dashboard expression as a recording rule."""
    exprs = dashboard_expressions(dashboard())
    rules = {"groups": [{"name": "parse", "rules": [{"record": f"trtspec:expr{i}", "expr": e} for i, e in enumerate(exprs)]}]}
    path = tmp_path / "exprs.yml"
    path.write_text(yaml.safe_dump(rules))
    result = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(exprs)} rules found" in result.stdout


def test_metric_table() -> None:
    for spec in M.ALL:
        assert set(spec.labels) <= ALLOWED_LABELS, spec.name
        assert spec.name in spec.promql or spec.kind is M.Kind.HISTOGRAM and f"{spec.name}_" in spec.promql, spec.name
        assert spec.help.strip().endswith("."), spec.name
    assert "every earlier position" in M.ACCEPTED_BY_POSITION.help
    assert [M.position_label(i) for i in (1, 15, 16, 40)] == ["1", "15", "16+", "16+"]
    assert M.route_label(True) == "speculate" and M.route_label(False) == "target_only"


def test_cli_metrics_lists_the_table() -> None:
    result = runner.invoke(app, ["metrics", "--json"])
    assert result.exit_code == 0, result.output
    names = [m["name"] for m in json.loads(result.stdout)["metrics"]]
    assert names == [spec.name for spec in M.ALL]


def test_docs_name_every_metric_and_alert() -> None:
    doc = (Path(__file__).parents[2] / "docs" / "observability.md").read_text()
    for spec in M.ALL:
        assert f"`{spec.name}`" in doc, spec.name
    for rule in alert_rules()["groups"][0]["rules"]:
        assert f"`{rule['alert']}`" in doc, rule["alert"]
    assert M.rejection_rate_expr("5m") in doc
