"""``trtspec monitoring``: the Prometheus alert rules, the Grafana dashboard and the metric table.

    trtspec monitoring rules [--slo-ttft-ms 1000 --slo-itl-ms 100] > rules.yml
    trtspec monitoring dashboard > dashboard.json
    trtspec monitoring metrics [--json]
"""

from __future__ import annotations

import json
import sys
from typing import Annotated

import typer

from trtspec.cli.common import JsonOpt, fail, print_json
from trtspec.obs import metrics as M
from trtspec.obs.dashboard import dashboard as make_dashboard
from trtspec.obs.rules import AlertConfig, alert_rules, render_rules

app = typer.Typer(
    help="Prometheus alert rules, Grafana dashboard and the metric table for a trtspec deployment.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

SloTtftOpt = Annotated[
    float, typer.Option("--slo-ttft-ms", help="p99 time-to-first-token limit (ms) of the critical alert.")
]
SloItlOpt = Annotated[
    float, typer.Option("--slo-itl-ms", help="p99 inter-token latency limit (ms) of the critical alert.")
]
BudgetOpt = Annotated[
    float, typer.Option("--fallback-budget", help="Share of speculating requests that may fall back (policy rollout.fallback_budget).")
]

_DEFAULT = AlertConfig()


def _config(slo_ttft_ms: float, slo_itl_ms: float, fallback_budget: float) -> AlertConfig:
    for option, ms in (("--slo-ttft-ms", slo_ttft_ms), ("--slo-itl-ms", slo_itl_ms)):
        if not ms > 0:  # named as given, in milliseconds (the config holds seconds)
            fail(f"{option} must be > 0, got {ms:g}")
    try:
        return AlertConfig(slo_ttft_s=slo_ttft_ms / 1000.0, slo_itl_s=slo_itl_ms / 1000.0, fallback_budget=fallback_budget)
    except ValueError as e:
        fail(str(e).replace("fallback_budget", "--fallback-budget"))


@app.command("rules")
def rules(
    slo_ttft_ms: SloTtftOpt = _DEFAULT.slo_ttft_s * 1000,
    slo_itl_ms: SloItlOpt = _DEFAULT.slo_itl_s * 1000,
    fallback_budget: BudgetOpt = _DEFAULT.fallback_budget,
    json_out: JsonOpt = False,
) -> None:
    """Print the Prometheus alert rules (YAML; check with `promtool check rules`)."""
    cfg = _config(slo_ttft_ms, slo_itl_ms, fallback_budget)
    if json_out:
        print_json(alert_rules(cfg))
    else:
        sys.stdout.write(render_rules(cfg))


@app.command("dashboard")
def dashboard(
    slo_ttft_ms: SloTtftOpt = _DEFAULT.slo_ttft_s * 1000,
    slo_itl_ms: SloItlOpt = _DEFAULT.slo_itl_s * 1000,
    fallback_budget: BudgetOpt = _DEFAULT.fallback_budget,
) -> None:
    """Print the Grafana dashboard (JSON; import it in Grafana and pick the Prometheus data source)."""
    cfg = _config(slo_ttft_ms, slo_itl_ms, fallback_budget)
    sys.stdout.write(json.dumps(make_dashboard(cfg), indent=2) + "\n")


@app.command("metrics")
def metrics(json_out: JsonOpt = False) -> None:
    """List every metric trtspec exports: name, type, labels, help and the PromQL that reads it."""
    rows = [
        {
            "name": m.name,
            "type": m.kind.value,
            "labels": list(m.labels),
            "help": m.help,
            "promql": m.promql,
            **({"buckets": list(m.buckets)} if m.buckets else {}),
        }
        for m in M.ALL
    ]
    if json_out:
        print_json({"metrics": rows})
        return
    for r in rows:
        sys.stdout.write(f"{r['name']} ({r['type']}; {', '.join(r['labels'])})\n    {r['help']}\n    PromQL: {r['promql']}\n")
