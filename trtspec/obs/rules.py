"""Prometheus alert rules, generated from the metric table.

Four alerts (each with a ``runbook`` line in its annotations):

=================================  ========  ==============================================================
alert                              severity  fires when
=================================  ========  ==============================================================
``TrtspecRejectionRateHigh``       warning   rejection rate over 5m above 15%, for 5 minutes
``TrtspecRejectionRateCritical``   critical  rejection rate over 1m above 25% AND an SLO breached (p99 time
                                             to first token or p99 inter-token latency over 5m above its
                                             limit), for 1 minute
``TrtspecBreakerOpen``             critical  the hard breaker is open now or opened in the last 5 minutes
``TrtspecFallbackBudgetExceeded``  warning   speculating requests that fell back, over 15m, above the
                                             rollout budget (3%), with at least 20 such requests, for 5 min
=================================  ========  ==============================================================

The rejection rate is always the draft model's per tested position,
``1 - sum(rate(accepted{drafter="model"})) / sum(rate(tested{drafter="model"}))``
(:func:`trtspec.obs.metrics.rejection_rate_expr`), the rate the breaker watches. The breaker can stay OPEN
only ``cooldown_s`` (30 s) before probing, so "opened in the last 5 minutes"
keeps the alert from flickering in and out between scrapes.
"""

from __future__ import annotations

from dataclasses import dataclass

import yaml

from trtspec.obs import metrics as M



@dataclass(frozen=True)
class AlertConfig:
    """Thresholds and windows of the alert rules (defaults: the operators' numbers)."""

    slo_ttft_s: float = 1.0  # p99 time to first token limit
    slo_itl_s: float = 0.1  # p99 inter-token latency limit
    slo_window: str = "5m"
    warn_rejection: float = 0.15
    warn_window: str = "5m"
    warn_for: str = "5m"
    crit_rejection: float = 0.25
    crit_window: str = "1m"
    crit_for: str = "1m"
    fallback_budget: float = 0.03  # the rollout's fallback budget (policy rollout.fallback_budget)
    fallback_window: str = "15m"
    fallback_min_requests: int = 20  # policy rollout.budget_min_requests
    fallback_for: str = "5m"
    breaker_window: str = "5m"

    def __post_init__(self) -> None:
        for name in ("slo_ttft_s", "slo_itl_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        for name in ("warn_rejection", "crit_rejection", "fallback_budget"):
            if not 0.0 < getattr(self, name) < 1.0:
                raise ValueError(f"{name} must be in (0, 1), got {getattr(self, name)}")


def signals(cfg: AlertConfig = AlertConfig()) -> dict[str, str]:
    """The expressions the alerts compare with thresholds, by name (each must return data when traffic flows)."""
    speculate = f'{{route="{M.ROUTE_SPECULATE}"}}'
    w = cfg.fallback_window
    return {
        "rejection_rate_warn": M.rejection_rate_expr(cfg.warn_window),
        "rejection_rate_crit": M.rejection_rate_expr(cfg.crit_window),
        "ttft_p99": M.quantile_expr(0.99, M.TTFT, cfg.slo_window),
        "itl_p99": M.quantile_expr(0.99, M.ITL, cfg.slo_window),
        "breaker_open_now": f'max({M.BREAKER_STATE.name}{{state="open"}})',
        "breaker_opened": f'sum(increase({M.BREAKER_TRANSITIONS.name}{{to_state="open"}}[{cfg.breaker_window}]))',
        "fallback_ratio": (
            f"sum(rate({M.FALLBACK_REQUESTS.name}[{w}])) / sum(rate({M.ROUTE_DECISIONS.name}{speculate}[{w}]))"
        ),
        "speculating_requests": f"sum(increase({M.ROUTE_DECISIONS.name}{speculate}[{w}]))",
    }


def _alert(name: str, expr: str, severity: str, summary: str, description: str, runbook: str,
           for_: str | None = None) -> dict:
    rule: dict = {"alert": name, "expr": expr}
    if for_ is not None:
        rule["for"] = for_
    rule["labels"] = {"severity": severity}
    rule["annotations"] = {"summary": summary, "description": description, "runbook": runbook}
    return rule


def alert_rules(cfg: AlertConfig = AlertConfig()) -> dict:
    """The rules file as a dict (``yaml.safe_dump`` it, or use :func:`render_rules`)."""
    s = signals(cfg)
    ttft_ms, itl_ms = f"{cfg.slo_ttft_s * 1000:g}", f"{cfg.slo_itl_s * 1000:g}"
    warn_pct, crit_pct, budget_pct = _pct(cfg.warn_rejection), _pct(cfg.crit_rejection), _pct(cfg.fallback_budget)
    rules = [
        _alert(
            "TrtspecRejectionRateHigh",
            f"({s['rejection_rate_warn']}) > {cfg.warn_rejection}",
            "warning",
            f"Speculation rejection rate above {warn_pct} for {cfg.warn_for}",
            f"Rejection rate over {cfg.warn_window} is {{{{ $value | humanizePercentage }}}} "
            f"(the draft model's, 1 - accepted/tested; threshold {warn_pct}). Speculation is paying less.",
            "Check acceptance by position and the rejection heatmap on the dashboard; run "
            "`trtspec trace summarize` on the rejection trace to see which lengths/tokens are "
            "rejected; consider a lower k_max or routing that traffic to target_only.",
            for_=cfg.warn_for,
        ),
        _alert(
            "TrtspecRejectionRateCritical",
            f"({s['rejection_rate_crit']}) > {cfg.crit_rejection} and on() "
            f"(({s['ttft_p99']}) > {cfg.slo_ttft_s} or ({s['itl_p99']}) > {cfg.slo_itl_s})",
            "critical",
            f"Rejection rate above {crit_pct} and the latency SLO is breached",
            f"Rejection rate over {cfg.crit_window} is {{{{ $value | humanizePercentage }}}} "
            f"(threshold {crit_pct}) while p99 time to first token is above {ttft_ms} ms or p99 "
            f"inter-token latency above {itl_ms} ms. Users feel it.",
            "Turn speculation off now (policy rollout.mode: off, or requests with speculation: off) "
            "and confirm latency recovers; then check the draft model's health and version and "
            "whether the breaker is tripping.",
            for_=cfg.crit_for,
        ),
        _alert(
            "TrtspecBreakerOpen",
            f"({s['breaker_opened']}) > 0 or ({s['breaker_open_now']}) == 1",
            "critical",
            "The hard circuit breaker opened: no request speculates",
            f"The breaker is open now or opened in the last {cfg.breaker_window} (its rolling "
            "rejection rate passed the hard threshold); every request runs on the target alone.",
            "Look at the rolling rejection rate and breaker state panels; if the draft model was "
            "changed, roll it back; the breaker probes again after its cool-down, and closes on "
            "its own once probes are accepted.",
        ),
        _alert(
            "TrtspecFallbackBudgetExceeded",
            f"({s['fallback_ratio']}) > {cfg.fallback_budget} and on() "
            f"({s['speculating_requests']}) >= {cfg.fallback_min_requests}",
            "warning",
            f"Fallbacks above the rollout budget ({budget_pct})",
            f"{{{{ $value | humanizePercentage }}}} of speculating requests over {cfg.fallback_window} "
            f"fell back to the target alone (budget {budget_pct}).",
            "Find the fallback reason (zero_acceptance vs draft_error) on the dashboard; for "
            "draft_error check the draft model's logs and restarts; pause the rollout "
            "(rollout.mode: canary or off) until the ratio is back under budget.",
            for_=cfg.fallback_for,
        ),
    ]
    return {"groups": [{"name": "trtspec", "rules": rules}]}


def render_rules(cfg: AlertConfig = AlertConfig()) -> str:
    """The rules file as YAML, with a header saying how it was made."""
    header = (
        "# Prometheus alert rules for trtspec, generated by `trtspec monitoring rules` "
        f"(SLO: p99 TTFT {cfg.slo_ttft_s * 1000:g} ms, p99 ITL {cfg.slo_itl_s * 1000:g} ms).\n"
        "# Check: promtool check rules rules.yml\n"
    )
    return header + yaml.safe_dump(alert_rules(cfg), sort_keys=False, width=10_000, allow_unicode=True)


def rule_expressions(rules: dict) -> list[str]:
    """Every ``expr`` of a rules file dict."""
    return [r["expr"] for g in rules["groups"] for r in g["rules"]]


def _pct(x: float) -> str:
    return f"{x * 100:g}%"
