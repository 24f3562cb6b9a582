"""Every trtspec metric, defined once: name, kind, labels, help, buckets, and the PromQL that reads it.

The sinks (:mod:`trtspec.obs.sinks`), the recorder (:mod:`trtspec.obs.recorder`),
the alert rules (:mod:`trtspec.obs.rules`), the Grafana dashboard
(:mod:`trtspec.obs.dashboard`) and ``docs/observability.md`` all take names from
this table; nothing else spells a metric name.

Vocabulary (``trtspec/decoding/types.py``): per iteration the draft proposes ``k``
**drafted** tokens, verification keeps ``accepted`` of them (a prefix), one more
token (correction or **bonus**) is drawn from the target, and **emitted** tokens
are those appended to the output. An iteration with ``k > 0`` is a **draft**.
A **rejection event** is a draft in which at least one drafted token was
rejected (``accepted < k``).

A **tested** position is one verification reached: the accepted ones and, in a
draft with a rejection, the first rejected one (the positions after it are
never tested).

**Rejection rate** (``trtspec/control/rates.py``) is ``1 - accepted / tested``
of the draft model's drafts over a window: the rate the breaker watches, which
does not depend on how long the drafts are (over drafted tokens, a healthy draft
at 0.94 per position reads 20% at k = 5, 23% at k = 8) and leaves out the free
drafters (n-gram and suffix lookups, whose rejections cost next to nothing).
In PromQL, always of this shape::

    1 - sum(rate(trtspec_accepted_tokens_total{drafter="model"}[5m]))
      / sum(rate(trtspec_tested_tokens_total{drafter="model"}[5m]))

Labels are kept low-cardinality: ``model`` (the serving model's name),
``route`` (``speculate`` | ``target_only``: the request's route decision, i.e.
speculation on / off), ``reason`` (the decision's reason), ``position`` (draft
position, 1-based, ``16+`` for 16 and beyond), ``bucket`` (sequence-length
bucket), ``state`` / ``from_state`` / ``to_state`` (breaker states), ``role``
(``draft`` | ``target``), ``drafter`` (``model`` | ``ngram`` | ``suffix``: what
drafted the tokens), ``outcome`` (how a request ended).
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass

from trtspec.decoding.types import DrafterKind


class Kind(str, enum.Enum):
    COUNTER = "counter"
    GAUGE = "gauge"
    HISTOGRAM = "histogram"


@dataclass(frozen=True)
class MetricSpec:
    """One metric family. ``promql`` is how a dashboard or an operator reads it."""

    name: str
    kind: Kind
    help: str
    labels: tuple[str, ...]
    promql: str
    buckets: tuple[float, ...] = ()  # histogram upper bounds, ascending (+Inf is implied)

    def __post_init__(self) -> None:
        assert self.name.startswith(PREFIX), self.name
        assert "model" in self.labels, f"{self.name}: every metric carries the model label"
        assert (self.kind is Kind.HISTOGRAM) == bool(self.buckets), f"{self.name}: buckets iff histogram"
        assert list(self.buckets) == sorted(set(self.buckets)), f"{self.name}: buckets must ascend"
        assert self.kind is not Kind.COUNTER or self.name.endswith("_total"), f"{self.name}: counters end in _total"


PREFIX = "trtspec_"

ROUTE_SPECULATE = "speculate"  # speculation on
ROUTE_TARGET_ONLY = "target_only"  # speculation off
ROUTES = (ROUTE_SPECULATE, ROUTE_TARGET_ONLY)

# Sequence-length buckets of the rejection heatmap: [lo, hi) in tokens.
LENGTH_BUCKETS: tuple[tuple[int, float, str], ...] = (
    (0, 32, "0-32"),
    (32, 64, "32-64"),
    (64, 128, "64-128"),
    (128, 256, "128-256"),
    (256, 512, "256-512"),
    (512, math.inf, "512+"),
)
BUCKET_LABELS = tuple(label for _, _, label in LENGTH_BUCKETS)

# Draft positions get their own label up to MAX_POSITION - 1; the rest share "16+".
MAX_POSITION = 16

BREAKER_STATES = ("closed", "soft", "open", "half_open")  # trtspec.control.BreakerState values
# Every transition the breaker can make (trtspec/control/breaker.py), as (from, to).
BREAKER_STATE_CHANGES = (
    ("closed", "soft"),
    ("closed", "open"),
    ("soft", "open"),
    ("soft", "closed"),
    ("open", "half_open"),
    ("half_open", "closed"),
    ("half_open", "soft"),
    ("half_open", "open"),
)

FALLBACK_ZERO_ACCEPTANCE = "zero_acceptance"  # the fallback guard: 3 drafts in a row with nothing accepted
FALLBACK_DRAFT_ERROR = "draft_error"  # the draft failed; the request went on with the target alone
FALLBACK_REASONS = (FALLBACK_ZERO_ACCEPTANCE, FALLBACK_DRAFT_ERROR)


def length_bucket(seq_len: int) -> str:
    """The heatmap bucket of a sequence of ``seq_len`` tokens (``0-32``, ..., ``512+``)."""
    for lo, hi, label in LENGTH_BUCKETS:
        if lo <= seq_len < hi:
            return label
    raise AssertionError(f"negative sequence length {seq_len}")


def position_label(position: int) -> str:
    """Label of a 1-based draft position: ``"1"`` .. ``"15"``, then ``"16+"``."""
    assert position >= 1, position
    return str(position) if position < MAX_POSITION else f"{MAX_POSITION}+"


def route_label(speculating: bool) -> str:
    return ROUTE_SPECULATE if speculating else ROUTE_TARGET_ONLY


# the label selector of the draft model's series (alerts and dashboard watch the model; free drafters'
# rejections cost next to nothing)
DRAFT_MODEL = f'{{drafter="{DrafterKind.MODEL.value}"}}'


def rejection_rate_expr(window: str = "5m") -> str:
    """The draft model's rejection rate per tested position over ``window``, the one shape used
    everywhere (rules, dashboard, docs)."""
    return (
        f"1 - sum(rate({ACCEPTED_TOKENS.name}{DRAFT_MODEL}[{window}])) "
        f"/ sum(rate({TESTED_TOKENS.name}{DRAFT_MODEL}[{window}]))"
    )


def quantile_expr(q: float, spec: MetricSpec, window: str = "5m", by: tuple[str, ...] = ()) -> str:
    """``histogram_quantile(q, ...)`` of a histogram in the table, optionally split ``by`` labels."""
    assert spec.kind is Kind.HISTOGRAM
    group = ", ".join(("le", *by))
    return f"histogram_quantile({q}, sum by ({group}) (rate({spec.name}_bucket[{window}])))"


_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0)
_ITL_BUCKETS = (0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0)
_REQUEST_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0)
_STEP_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.5)
_TOKEN_COUNT_BUCKETS = (0, 1, 2, 3, 4, 5, 6, 7, 8, 12, 16, 32, 64)

# -- counters ------------------------------------------------------------------

ROUTE_DECISIONS = MetricSpec(
    "trtspec_route_decisions_total",
    Kind.COUNTER,
    "Requests by route decision (route: speculate = speculation on, target_only = off) and the "
    "decision's reason (a routing rule's reason, or request_off, quota, breaker_open, ...).",
    ("model", "route", "reason"),
    'sum by (route) (rate(trtspec_route_decisions_total[5m])); why requests ran without speculation: '
    'sum by (reason) (rate(trtspec_route_decisions_total{route="target_only"}[5m]))',
)
REQUESTS = MetricSpec(
    "trtspec_requests_total",
    Kind.COUNTER,
    "Finished requests by outcome: ok, invalid, cancelled, unavailable, error.",
    ("model", "outcome"),
    'sum by (outcome) (rate(trtspec_requests_total[5m]))',
)
DRAFTS = MetricSpec(
    "trtspec_drafts_total",
    Kind.COUNTER,
    "Drafts: iterations that drafted at least one token (k > 0), by drafter (model | ngram | suffix) and "
    "sequence-length bucket (tokens in the sequence before the iteration).",
    ("model", "drafter", "bucket"),
    "sum(rate(trtspec_drafts_total[5m])); mean draft length: "
    "sum(rate(trtspec_drafted_tokens_total[5m])) / sum(rate(trtspec_drafts_total[5m]))",
)
DRAFTERS = tuple(d.value for d in DrafterKind if d is not DrafterKind.AUTO)  # drafter label values

DRAFTED_TOKENS = MetricSpec(
    "trtspec_drafted_tokens_total",
    Kind.COUNTER,
    "Drafted tokens: proposed by a drafter (k per draft); drafter: model | ngram | suffix.",
    ("model", "drafter"),
    "acceptance per drafted token, by drafter: "
    "sum by (drafter) (rate(trtspec_accepted_tokens_total[5m])) / sum by (drafter) (rate(trtspec_drafted_tokens_total[5m]))",
)
TESTED_TOKENS = MetricSpec(
    "trtspec_tested_tokens_total",
    Kind.COUNTER,
    "Tested positions: drafted tokens verification reached (the accepted ones and each draft's first rejected "
    "one); by drafter: model | ngram | suffix.",
    ("model", "drafter"),
    'rejection rate: 1 - sum(rate(trtspec_accepted_tokens_total{drafter="model"}[5m])) '
    '/ sum(rate(trtspec_tested_tokens_total{drafter="model"}[5m]))',
)
ACCEPTED_TOKENS = MetricSpec(
    "trtspec_accepted_tokens_total",
    Kind.COUNTER,
    "Accepted tokens: drafted tokens kept by the target's verification (bonus and correction tokens excluded); "
    "by drafter: model | ngram | suffix.",
    ("model", "drafter"),
    "acceptance per tested position, by drafter: "
    "sum by (drafter) (rate(trtspec_accepted_tokens_total[5m])) / sum by (drafter) (rate(trtspec_tested_tokens_total[5m]))",
)
BONUS_TOKENS = MetricSpec(
    "trtspec_bonus_tokens_total",
    Kind.COUNTER,
    "Bonus tokens: drawn from the target after a draft whose k tokens were all accepted.",
    ("model",),
    "share of drafts fully accepted: sum(rate(trtspec_bonus_tokens_total[5m])) / sum(rate(trtspec_drafts_total[5m]))",
)
EMITTED_TOKENS = MetricSpec(
    "trtspec_emitted_tokens_total",
    Kind.COUNTER,
    "Emitted tokens: appended to the outputs (accepted + one correction or bonus token per iteration, "
    "fewer when a stop condition cuts an iteration short).",
    ("model",),
    "throughput in tokens/s: sum(rate(trtspec_emitted_tokens_total[5m])); mean acceptance length "
    "(emitted per iteration, bonus included) needs iterations: see trtspec_accepted_tokens_per_iteration",
)
DRAFTED_BY_POSITION = MetricSpec(
    "trtspec_drafted_tokens_by_position_total",
    Kind.COUNTER,
    "Drafted tokens by drafter and draft position (1 = the first drafted token of an iteration; 16+ = "
    "position 16 and beyond): a draft of k tokens adds one at each position 1..k.",
    ("model", "drafter", "position"),
    'the draft model\'s acceptance by position: sum by (position) (rate(trtspec_accepted_tokens_by_position_total'
    '{drafter="model"}[5m])) / sum by (position) (rate(trtspec_drafted_tokens_by_position_total{drafter="model"}[5m]))',
)
ACCEPTED_BY_POSITION = MetricSpec(
    "trtspec_accepted_tokens_by_position_total",
    Kind.COUNTER,
    "Accepted tokens by drafter and draft position (1 = the first drafted token). Acceptance is a prefix: a "
    "position counts only when it AND every earlier position of its draft were accepted, so accepted/drafted "
    "at position i is the share of drafts reaching position i whose first i tokens were all accepted.",
    ("model", "drafter", "position"),
    'sum by (drafter, position) (rate(trtspec_accepted_tokens_by_position_total[5m])) '
    '/ sum by (drafter, position) (rate(trtspec_drafted_tokens_by_position_total[5m]))',
)
REJECTIONS = MetricSpec(
    "trtspec_rejections_total",
    Kind.COUNTER,
    "Rejection events (drafts with at least one drafted token rejected) by drafter and sequence-length bucket "
    "(tokens in the sequence before the draft): over time, the time x length rejection heatmap.",
    ("model", "drafter", "bucket"),
    'heatmap of the draft model: sum by (bucket) (increase(trtspec_rejections_total{drafter="model"}[5m])); '
    'share of its drafts rejected per bucket: sum by (bucket) (rate(trtspec_rejections_total{drafter="model"}[5m])) '
    '/ sum by (bucket) (rate(trtspec_drafts_total{drafter="model"}[5m]))',
)
FALLBACKS = MetricSpec(
    "trtspec_fallbacks_total",
    Kind.COUNTER,
    "Fallbacks to the target alone by reason: zero_acceptance (the fallback guard: consecutive drafts "
    "with nothing accepted), draft_error (the draft model failed mid-request).",
    ("model", "reason"),
    "sum by (reason) (rate(trtspec_fallbacks_total[5m]))",
)
K_CHOICES = MetricSpec(
    "trtspec_k_choices_total",
    Kind.COUNTER,
    "Iterations of speculating requests by drafter and why their draft length k was chosen: the "
    "controller's reason (goodput: best, explore, probe, redraw, young, nothing_pays, not_worth_it, "
    "wait; controller for controllers that give none), or what barred the draft (breaker, fallback).",
    ("model", "drafter", "reason"),
    'why speculating requests draft: sum by (drafter, reason) (rate(trtspec_k_choices_total[5m]))',
)
FALLBACK_REQUESTS = MetricSpec(
    "trtspec_fallback_requests_total",
    Kind.COUNTER,
    "Speculating requests that fell back to the target alone at least once (what the rollout's "
    "fallback budget counts).",
    ("model",),
    'fallback ratio: sum(rate(trtspec_fallback_requests_total[15m])) / '
    'sum(rate(trtspec_route_decisions_total{route="speculate"}[15m]))',
)
BREAKER_TRANSITIONS = MetricSpec(
    "trtspec_breaker_transitions_total",
    Kind.COUNTER,
    "Circuit-breaker transitions by from/to state (closed, soft, open, half_open).",
    ("model", "from_state", "to_state"),
    'sum(increase(trtspec_breaker_transitions_total{to_state="open"}[1h]))',
)

# -- gauges ------------------------------------------------------------------------

DRAFT_LENGTH = MetricSpec(
    "trtspec_draft_length",
    Kind.GAUGE,
    "Current draft length: moving average (weight 0.1 on the newest) of k over recent drafts.",
    ("model",),
    "max(trtspec_draft_length)",
)
DRAFT_LENGTH_CAP = MetricSpec(
    "trtspec_draft_length_cap",
    Kind.GAUGE,
    "The largest k a request may draft with the draft model now (k_max; halved while the breaker is soft; "
    "0 while open; ngram and suffix are not capped).",
    ("model",),
    "min(trtspec_draft_length_cap)",
)
BREAKER_STATE = MetricSpec(
    "trtspec_breaker_state",
    Kind.GAUGE,
    "Circuit-breaker state (it guards the draft model): 1 for the current state, 0 for the others.",
    ("model", "state"),
    'max by (state) (trtspec_breaker_state); open now: max(trtspec_breaker_state{state="open"}) == 1',
)
ROLLING_REJECTION_RATE = MetricSpec(
    "trtspec_rolling_rejection_rate",
    Kind.GAUGE,
    "The breaker's rolling rejection rate per tested position of the draft model's drafts (1 - accepted/tested "
    "over its window, tested: accepted positions and each iteration's first rejected one; NaN when nothing "
    "was drafted).",
    ("model",),
    "max(trtspec_rolling_rejection_rate)",
)
SPECULATING_NOW = MetricSpec(
    "trtspec_requests_speculating",
    Kind.GAUGE,
    "Requests speculating now (routed to speculate and not finished).",
    ("model",),
    "sum(trtspec_requests_speculating)",
)
MODEL_MEMORY = MetricSpec(
    "trtspec_model_memory_bytes",
    Kind.GAUGE,
    "Memory held by the draft and the target model (weights and caches, as the runtime reports it).",
    ("model", "role"),
    "sum by (role) (trtspec_model_memory_bytes)",
)

# -- histograms --------------------------------------------------------------------

TTFT = MetricSpec(
    "trtspec_time_to_first_token_seconds",
    Kind.HISTOGRAM,
    "Time to first token: from the request's start to its first emitted token, by route "
    "(speculate = speculation on, target_only = off).",
    ("model", "route"),
    "p99 by route: histogram_quantile(0.99, sum by (le, route) (rate(trtspec_time_to_first_token_seconds_bucket[5m])))",
    _LATENCY_BUCKETS,
)
ITL = MetricSpec(
    "trtspec_inter_token_latency_seconds",
    Kind.HISTOGRAM,
    "Inter-token latency after the first token: one observation per streamed chunk, the time since the "
    "previous chunk divided by the chunk's tokens, by route (speculation on/off).",
    ("model", "route"),
    "p99 by route: histogram_quantile(0.99, sum by (le, route) (rate(trtspec_inter_token_latency_seconds_bucket[5m])))",
    _ITL_BUCKETS,
)
REQUEST_LATENCY = MetricSpec(
    "trtspec_request_latency_seconds",
    Kind.HISTOGRAM,
    "Request latency of completed requests (outcome ok): from the request's start to its last token, by route "
    "(speculation on/off).",
    ("model", "route"),
    "histogram_quantile(0.5, sum by (le, route) (rate(trtspec_request_latency_seconds_bucket[5m])))",
    _REQUEST_BUCKETS,
)
ACCEPTED_PER_ITERATION = MetricSpec(
    "trtspec_accepted_tokens_per_iteration",
    Kind.HISTOGRAM,
    "Tokens accepted per draft (0..k; the bonus/correction token not included).",
    ("model",),
    "mean: sum(rate(trtspec_accepted_tokens_per_iteration_sum[5m])) / sum(rate(trtspec_accepted_tokens_per_iteration_count[5m]))",
    _TOKEN_COUNT_BUCKETS,
)
DRAFT_STEP = MetricSpec(
    "trtspec_draft_step_seconds",
    Kind.HISTOGRAM,
    "Draft step time: proposing the k tokens of one draft.",
    ("model",),
    "histogram_quantile(0.5, sum by (le) (rate(trtspec_draft_step_seconds_bucket[5m])))",
    _STEP_BUCKETS,
)
VERIFY_STEP = MetricSpec(
    "trtspec_verify_step_seconds",
    Kind.HISTOGRAM,
    "Verify step time: the target's one pass over a draft's k tokens, and acceptance.",
    ("model",),
    "histogram_quantile(0.5, sum by (le) (rate(trtspec_verify_step_seconds_bucket[5m])))",
    _STEP_BUCKETS,
)
TARGET_STEP = MetricSpec(
    "trtspec_target_step_seconds",
    Kind.HISTOGRAM,
    "Plain target step time: an iteration that drafted nothing (k = 0).",
    ("model",),
    "histogram_quantile(0.5, sum by (le) (rate(trtspec_target_step_seconds_bucket[5m])))",
    _STEP_BUCKETS,
)

ALL: tuple[MetricSpec, ...] = (
    ROUTE_DECISIONS,
    REQUESTS,
    DRAFTS,
    DRAFTED_TOKENS,
    TESTED_TOKENS,
    ACCEPTED_TOKENS,
    BONUS_TOKENS,
    EMITTED_TOKENS,
    DRAFTED_BY_POSITION,
    ACCEPTED_BY_POSITION,
    REJECTIONS,
    FALLBACKS,
    K_CHOICES,
    FALLBACK_REQUESTS,
    BREAKER_TRANSITIONS,
    DRAFT_LENGTH,
    DRAFT_LENGTH_CAP,
    BREAKER_STATE,
    ROLLING_REJECTION_RATE,
    SPECULATING_NOW,
    MODEL_MEMORY,
    TTFT,
    ITL,
    REQUEST_LATENCY,
    ACCEPTED_PER_ITERATION,
    DRAFT_STEP,
    VERIFY_STEP,
    TARGET_STEP,
)
BY_NAME: dict[str, MetricSpec] = {m.name: m for m in ALL}
assert len(BY_NAME) == len(ALL), "duplicate metric name"


def series_names(spec: MetricSpec) -> tuple[str, ...]:
    """The series names a family exposes (a histogram's ``_bucket``, ``_sum``, ``_count``)."""
    if spec.kind is Kind.HISTOGRAM:
        return (f"{spec.name}_bucket", f"{spec.name}_sum", f"{spec.name}_count")
    return (spec.name,)
