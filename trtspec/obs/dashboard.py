"""The Grafana dashboard, generated from the metric table (``trtspec monitoring dashboard > dashboard.json``).

Rows, top to bottom: is speculation paying (acceptance and rejection rate,
acceptance by draft position, the rejection heatmap by sequence length), what
the guard rails do (draft length, breaker state, fallbacks, routing), what
users feel (time to first token, inter-token and request latency, p50 and p99,
speculation on vs off), and what it costs (throughput, step times, memory).
Import it in Grafana (Dashboards -> Import) and pick the Prometheus data source.
"""

from __future__ import annotations

from typing import Any

from trtspec.obs import metrics as M
from trtspec.obs.rules import AlertConfig

DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}


def _target(expr: str, legend: str = "", ref: str = "A") -> dict:
    return {"refId": ref, "expr": expr, "legendFormat": legend or "__auto", "datasource": DATASOURCE}


def _panel(
    title: str,
    targets: list[tuple[str, str]],
    *,
    unit: str = "short",
    kind: str = "timeseries",
    description: str = "",
    thresholds: tuple[float, ...] = (),
    options: dict | None = None,
) -> dict:
    steps: list[dict[str, Any]] = [{"color": "green", "value": None}]
    for value, color in zip(thresholds, ("orange", "red")):
        steps.append({"color": color, "value": value})
    defaults: dict[str, Any] = {"unit": unit, "thresholds": {"mode": "absolute", "steps": steps}}
    if thresholds and kind == "timeseries":
        defaults["custom"] = {"thresholdsStyle": {"mode": "line"}}
    panel = {
        "type": kind,
        "title": title,
        "description": description,
        "datasource": DATASOURCE,
        "targets": [_target(expr, legend, chr(ord("A") + i)) for i, (expr, legend) in enumerate(targets)],
        "fieldConfig": {"defaults": defaults, "overrides": []},
        "options": options or {"legend": {"displayMode": "list", "placement": "bottom"}, "tooltip": {"mode": "multi"}},
    }
    return panel


def _p(q: float, spec: M.MetricSpec, by: tuple[str, ...] = ()) -> str:
    return M.quantile_expr(q, spec, "5m", by)


def _paying_panels(cfg: AlertConfig) -> list[dict]:
    """Is speculation paying: acceptance and rejection rate, by draft position, by sequence length."""
    accepted, tested = M.ACCEPTED_TOKENS.name, M.TESTED_TOKENS.name
    return [
        _panel(
            "Acceptance and rejection rate",
            [
                (f"sum by (drafter) (rate({accepted}[5m])) / sum by (drafter) (rate({tested}[5m]))",
                 "{{drafter}} acceptance per tested position"),
                (M.rejection_rate_expr("5m"), "rejection rate (5m)"),
                (M.rejection_rate_expr("1m"), "rejection rate (1m)"),
                (f"max({M.ROLLING_REJECTION_RATE.name})", "breaker's rolling rejection rate"),
            ],
            unit="percentunit",
            thresholds=(cfg.warn_rejection, cfg.crit_rejection),
            description="Rejection rate: the draft model's 1 - accepted/tested (tested: accepted positions and each "
                        "draft's first rejected one), as the breaker and the alerts read it. Lines: the warning and "
                        "critical alert thresholds.",
        ),
        _panel(
            "Acceptance by draft position",
            [
                (
                    f"sum by (position) (rate({M.ACCEPTED_BY_POSITION.name}{M.DRAFT_MODEL}[5m])) "
                    f"/ sum by (position) (rate({M.DRAFTED_BY_POSITION.name}{M.DRAFT_MODEL}[5m]))",
                    "position {{position}}",
                )
            ],
            unit="percentunit",
            description="The draft model's drafts: share of those reaching position i whose first i tokens "
                        "were all accepted.",
        ),
        _panel(
            "Rejection heatmap: sequence length x time",
            [(f"sum by (bucket) (increase({M.REJECTIONS.name}{M.DRAFT_MODEL}[5m]))", "{{bucket}}")],
            kind="heatmap",
            description="The draft model's rejection events (drafts with a rejected token) per 5 minutes, by "
                        "tokens in the sequence.",
            options={
                "calculate": False,
                "yAxis": {"axisPlacement": "left"},
                "rowsFrame": {"layout": "auto"},
                "color": {"mode": "scheme", "scheme": "Oranges"},
                "cellGap": 1,
            },
        ),
        _panel(
            "Rejected share of drafts by sequence length",
            [
                (
                    f"sum by (bucket) (rate({M.REJECTIONS.name}{M.DRAFT_MODEL}[5m])) "
                    f"/ sum by (bucket) (rate({M.DRAFTS.name}{M.DRAFT_MODEL}[5m]))",
                    "{{bucket}}",
                )
            ],
            unit="percentunit",
        ),
    ]


def _guard_rail_panels(cfg: AlertConfig) -> list[dict]:
    """What the guard rails do: draft length, breaker state, fallbacks, routing."""
    return [
        _panel(
            "Draft length",
            [
                (f"sum(rate({M.DRAFTED_TOKENS.name}[5m])) / sum(rate({M.DRAFTS.name}[5m]))", "mean k (5m)"),
                (f"max({M.DRAFT_LENGTH.name})", "current k (moving average)"),
                (f"min({M.DRAFT_LENGTH_CAP.name})", "k cap"),
            ],
        ),
        _panel(
            "Breaker state",
            [(f"max by (state) ({M.BREAKER_STATE.name})", "{{state}}")],
            kind="state-timeline",
            description="1 marks the current state: closed, soft (k halved), open (no speculation), half_open (probing).",
            options={"showValue": "never", "mergeValues": True, "legend": {"displayMode": "list", "placement": "bottom"}},
        ),
        _panel(
            "Breaker transitions and fallbacks",
            [
                (f"sum by (to_state) (increase({M.BREAKER_TRANSITIONS.name}[5m]))", "breaker -> {{to_state}}"),
                (f"sum by (reason) (increase({M.FALLBACKS.name}[5m]))", "fallback: {{reason}}"),
            ],
        ),
        _panel(
            "Fallback ratio (speculating requests that fell back)",
            [
                (
                    f"sum(rate({M.FALLBACK_REQUESTS.name}[15m])) "
                    f'/ sum(rate({M.ROUTE_DECISIONS.name}{{route="{M.ROUTE_SPECULATE}"}}[15m]))',
                    "fallback ratio (15m)",
                )
            ],
            unit="percentunit",
            thresholds=(cfg.fallback_budget,),
        ),
        _panel(
            "Draft length: why each k was chosen",
            [(f"sum by (drafter, reason) (rate({M.K_CHOICES.name}[5m]))", "{{drafter}}: {{reason}}")],
            description="Iterations of speculating requests per second by drafter and the controller's reason "
            "(best, explore, probe, redraw, young, nothing_pays, not_worth_it, wait) or what barred the "
            "draft (breaker, fallback); docs/control.md.",
        ),
        _panel(
            "Routing: requests by route and reason",
            [
                (f"sum by (route) (rate({M.ROUTE_DECISIONS.name}[5m]))", "{{route}}"),
                (f"sum by (reason) (rate({M.ROUTE_DECISIONS.name}[5m]))", "reason: {{reason}}"),
                (f"sum({M.SPECULATING_NOW.name})", "speculating now"),
            ],
            unit="reqps",
        ),
    ]


def _user_panels(cfg: AlertConfig) -> list[dict]:
    """What users feel: time to first token, inter-token and request latency, speculation on vs off."""
    route = ("route",)
    on_off = "{{route}}"
    return [
        _panel(
            "Time to first token p50 / p99: speculation on vs off",
            [(_p(0.5, M.TTFT, route), f"p50 {on_off}"), (_p(0.99, M.TTFT, route), f"p99 {on_off}")],
            unit="s",
            thresholds=(cfg.slo_ttft_s,),
            description="route speculate = speculation on, target_only = off. Line: the TTFT SLO.",
        ),
        _panel(
            "Inter-token latency p50 / p99: speculation on vs off",
            [(_p(0.5, M.ITL, route), f"p50 {on_off}"), (_p(0.99, M.ITL, route), f"p99 {on_off}")],
            unit="s",
            thresholds=(cfg.slo_itl_s,),
            description="Per streamed chunk: time since the previous chunk / its tokens. Line: the ITL SLO.",
        ),
        _panel(
            "Request latency p50 / p99: speculation on vs off",
            [
                (_p(0.5, M.REQUEST_LATENCY, route), f"p50 {on_off}"),
                (_p(0.99, M.REQUEST_LATENCY, route), f"p99 {on_off}"),
            ],
            unit="s",
        ),
    ]


def _cost_panels() -> list[dict]:
    """What it costs: throughput, tokens per draft, step times, memory."""
    return [
        _panel(
            "Throughput",
            [
                (f"sum(rate({M.EMITTED_TOKENS.name}[5m]))", "emitted tokens/s"),
                (f"sum(rate({M.BONUS_TOKENS.name}[5m]))", "bonus tokens/s"),
                (f"sum(rate({M.REQUESTS.name}[5m]))", "finished requests/s"),
            ],
        ),
        _panel(
            "Tokens accepted per draft",
            [
                (
                    f"sum(rate({M.ACCEPTED_PER_ITERATION.name}_sum[5m])) "
                    f"/ sum(rate({M.ACCEPTED_PER_ITERATION.name}_count[5m]))",
                    "mean",
                ),
                (_p(0.5, M.ACCEPTED_PER_ITERATION), "p50"),
            ],
        ),
        _panel(
            "Step time p50 / p99: draft, verify, plain target step",
            [
                (_p(0.5, M.DRAFT_STEP), "draft p50"),
                (_p(0.99, M.DRAFT_STEP), "draft p99"),
                (_p(0.5, M.VERIFY_STEP), "verify p50"),
                (_p(0.99, M.VERIFY_STEP), "verify p99"),
                (_p(0.5, M.TARGET_STEP), "target step p50"),
            ],
            unit="s",
        ),
        _panel(
            "Memory: draft and target",
            [(f"sum by (role) ({M.MODEL_MEMORY.name})", "{{role}}")],
            unit="bytes",
        ),
    ]


def dashboard(cfg: AlertConfig = AlertConfig()) -> dict:
    """The dashboard as Grafana's JSON model."""
    panels = _paying_panels(cfg) + _guard_rail_panels(cfg) + _user_panels(cfg) + _cost_panels()
    width, height = 12, 8
    for i, p in enumerate(panels):
        p["id"] = i + 1
        p["gridPos"] = {"x": (i % 2) * width, "y": (i // 2) * height, "w": width, "h": height}
    return {
        "title": "trtspec: speculative decoding",
        "uid": "trtspec-spec",
        "description": "Is speculation paying, where does it fail, and what do users feel. Generated by trtspec.",
        "tags": ["trtspec", "triton", "speculative-decoding"],
        "editable": True,
        "schemaVersion": 39,
        "version": 1,
        "refresh": "30s",
        "time": {"from": "now-6h", "to": "now"},
        "timezone": "utc",
        "annotations": {"list": []},
        "templating": {
            "list": [
                {
                    "name": "datasource",
                    "label": "Prometheus",
                    "type": "datasource",
                    "query": "prometheus",
                    "current": {},
                    "hide": 0,
                }
            ]
        },
        "panels": panels,
    }


def dashboard_expressions(d: dict) -> list[str]:
    """Every PromQL expression of a dashboard's panels."""
    return [t["expr"] for p in d["panels"] for t in p.get("targets", [])]
