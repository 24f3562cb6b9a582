"""``trtspec plan``: from request logs and bench measurements to expected speedup, ROI and a policy.

Steps (each documented in ``docs/bench_plan.md``):

1. Read the log (:mod:`trtspec.plan.logs`): requests, their rate, the
   prompt/output length distribution by bucket.
2. Speculation inputs: alpha, c and k from explicit values or bench results
   (:func:`bench_inputs`): alpha from the speculating arm's acceptance rate
   (pooled over the runs, per length bucket where a bucket has >= 50 drafted
   tokens), c from the least-loaded run's iteration time over its target
   step, k from drafted tokens per iteration; (rate, measured speedup) points
   for the load correction.
3. Per bucket: Leviathan's speedup at (alpha_b, k, c), times the load factor
   at the per-GPU request rate (:func:`trtspec.plan.model.load_factor`).
4. Overall: the token-weighted harmonic mix over the log's requests, each
   speculating or not as the policy's router decides (the current policy and
   the recommended one).
5. ROI: GPU-hours/day with and without speculation at the logged rate and the
   tokens/s one GPU generates; hours saved x price.
6. The recommended policy (:mod:`trtspec.plan.policy`).
7. By drafter (:func:`plan_by_drafter`): bench runs are grouped by the drafter
   their speculating arms sent (``trtspec bench --drafter``; ``default``: none
   named); steps 2-6 run per drafter and the plan is the one of the drafter
   whose recommended policy gives the highest overall speedup.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from trtspec.bench.records import RequestRecord
from trtspec.bench.runner import DEFAULT_DRAFTER, BenchResult
from trtspec.bench.stats import estimate_k
from trtspec.control.config import Policy
from trtspec.errors import TrtspecError
from trtspec.plan import model
from trtspec.plan.logs import RequestLog

# Context-length buckets (lo, hi]: a context of n tokens is in the first bucket with n <= hi.
# The edges are the thresholds a routing rule ("context_tokens_gt: lo") can use.
BUCKET_EDGES = (0, 32, 64, 128, 256, 512, 1024, 2048)
MIN_BUCKET_DRAFTED = 50  # drafted tokens a bucket needs before its own alpha is used
DEFAULT_K = 5
DEFAULT_THRESHOLD = 64


class PlanError(TrtspecError):
    """The planner lacks an input or got an unusable one."""


@dataclass(frozen=True)
class Bucket:
    lo: int
    hi: float  # inf for the last

    @property
    def label(self) -> str:
        first = self.lo + 1 if self.lo else 0
        return f"{first}+" if self.hi == float("inf") else f"{first}-{int(self.hi)}"

    def holds(self, n: int) -> bool:
        return (n > self.lo or self.lo == 0) and n <= self.hi


BUCKETS = tuple(Bucket(lo, hi) for lo, hi in zip(BUCKET_EDGES, (*BUCKET_EDGES[1:], float("inf")), strict=True))


def bucket_of(n: int) -> Bucket:
    for b in BUCKETS:
        if n <= b.hi:
            return b
    raise AssertionError(n)


@dataclass
class BenchPoint:
    path: str
    rate: float  # requests/s (open loop: the target rate; closed loop: achieved)
    speedup: float | None  # off arm's ms/token over the speculating arm's
    errors: int
    sent: int
    tokens_per_s: float


@dataclass
class SpecInputs:
    alpha: float
    c: float
    k: int
    source: str
    acceptance_rate: float | None = None
    alpha_by_bucket: dict[str, float] = field(default_factory=dict)  # measured, buckets with enough drafts
    points: list[BenchPoint] = field(default_factory=list)
    capacity_tokens_per_s: float | None = None  # most tokens/s a bench run without errors sustained

    def to_dict(self) -> dict:
        return {
            "alpha": self.alpha,
            "c": self.c,
            "k": self.k,
            "source": self.source,
            "acceptance_rate": self.acceptance_rate,
            "alpha_by_bucket": self.alpha_by_bucket,
            "bench_points": [asdict(p) for p in self.points],
            "capacity_tokens_per_s": self.capacity_tokens_per_s,
        }


def _spec_arm(by_arm: dict) -> str | None:
    return next((a for a in ("auto", "on") if a in by_arm), None)


def bench_inputs(results: Sequence[tuple[str, BenchResult]], k: int | None = None) -> SpecInputs:
    """Alpha, c, k and the load points from bench results ``[(path, BenchResult), ...]``."""
    if not results:
        raise PlanError("no bench results")
    drafted = accepted = 0
    spec_records: list[RequestRecord] = []
    bucket_counts: dict[str, list[int]] = {}
    points: list[BenchPoint] = []
    for path, res in results:
        s = res.summary
        cfg = res.config
        arm = _spec_arm(s["by_arm"])
        if arm is None:
            raise PlanError(f"{path}: no speculating arm (auto or on) in this bench run")
        for r in res.records:
            if r.arm != arm or not r.answered:
                continue
            drafted += r.drafted
            accepted += r.accepted
            spec_records.append(r)
            counts = bucket_counts.setdefault(bucket_of(r.input_tokens).label, [0, 0])
            counts[0] += r.drafted
            counts[1] += r.accepted
        rate = cfg.get("rate_rps") or s.get("achieved_send_rate_rps") or 0.0
        points.append(BenchPoint(path, float(rate), s["speedup_vs_off"].get(arm), s["overall"]["errors"],
                                 s["overall"]["sent"], s["overall"]["tokens_per_s"]))
    if not drafted:
        raise PlanError("the bench results hold no drafted tokens: speculation never ran, so alpha is unknown")
    if k is None:
        k = estimate_k(spec_records) or DEFAULT_K
    rate = accepted / drafted
    alpha = model.alpha_from_rate(rate, k)
    by_bucket = {label: model.alpha_from_rate(a / d, k) for label, (d, a) in bucket_counts.items() if d >= MIN_BUCKET_DRAFTED}
    # c from the least-loaded run that has both arms' chunk gaps.
    c = None
    for _, res in sorted(results, key=lambda pr: pr[1].config.get("rate_rps") or 0.0):
        by_arm = res.summary["by_arm"]
        arm = _spec_arm(by_arm)
        off = by_arm.get("off")
        if arm and off and off.get("chunk_interval_ms_p50") and by_arm[arm].get("chunk_interval_ms_p50"):
            c = model.effective_c(by_arm[arm]["chunk_interval_ms_p50"], off["chunk_interval_ms_p50"], k)
            break
    if c is None:
        raise PlanError("the bench results lack an 'off' arm to measure the cost ratio c against; pass --c")
    clean = [p.tokens_per_s for p in points if p.errors == 0 and p.sent > 0]
    return SpecInputs(
        alpha=alpha,
        c=c,
        k=k,
        source="bench: " + ", ".join(p for p, _ in results),
        acceptance_rate=rate,
        alpha_by_bucket=by_bucket,
        points=points,
        capacity_tokens_per_s=max(clean) if clean else None,
    )


def bench_inputs_by_drafter(results: Sequence[tuple[str, BenchResult]], k: int | None = None) -> dict[str, SpecInputs]:
    """:func:`bench_inputs` of each drafter's runs (:attr:`BenchResult.drafter`), in the order first seen."""
    groups: dict[str, list[tuple[str, BenchResult]]] = {}
    for path, res in results:
        groups.setdefault(res.drafter, []).append((path, res))
    inputs = {}
    for name, group in groups.items():
        try:
            inputs[name] = bench_inputs(group, k)
        except PlanError as e:
            if len(groups) == 1:
                raise
            raise PlanError(f"drafter {name}: {e}") from None
    return inputs


@dataclass
class PlanConfig:
    alpha: float | None = None
    c: float | None = None
    k: int | None = None
    gpu_price: float | None = None  # per GPU-hour
    tokens_per_s: float | None = None  # one GPU, speculation off
    rate_per_gpu: float | None = None  # requests/s one server sees (load correction)
    threshold: int | None = None  # the current speculation threshold (default: the current policy's)
    min_gain: float = 0.05
    current_policy: Policy | None = None  # the deployed policy; default Policy()


def _router(policy: Policy | None):
    from trtspec.control.router import Router

    return Router((policy or Policy()).routing)


def _speculates(router, rec) -> bool:
    from trtspec.wire import Priority
    from trtspec.control.types import RequestInfo

    info = RequestInfo(context_tokens=rec.prompt_tokens, max_new_tokens=rec.output_tokens,
                       priority=Priority(rec.priority))
    return router.route(info).speculate


def current_threshold(policy: Policy | None) -> int:
    """The context threshold of the first ``speculate`` rule with ``context_tokens_gt``, else 64."""
    from trtspec.control.config import RouteAction

    for rule in (policy or Policy()).routing.rules:
        if rule.action is RouteAction.SPECULATE and rule.when.context_tokens_gt is not None:
            return rule.when.context_tokens_gt
    return DEFAULT_THRESHOLD


def log_stats(log: RequestLog) -> dict:
    recs = log.records
    ts = [r.timestamp for r in recs]
    span = max(ts) - min(ts)
    n = len(recs)
    rate = (n - 1) / span if span > 0 and n > 1 else None  # n arrivals over the span: n - 1 gaps
    return {
        "path": log.path,
        "format": log.format,
        "requests": n,
        "bad_rows": [{"line": p.line, "message": p.message} for p in log.problems],
        "first_timestamp": min(ts),
        "last_timestamp": max(ts),
        "span_s": span,
        "requests_per_s": rate,
        "requests_per_day": rate * 86400 if rate is not None else None,
        "mean_prompt_tokens": sum(r.prompt_tokens for r in recs) / n,
        "mean_output_tokens": sum(r.output_tokens for r in recs) / n,
        "by_priority": dict(Counter(r.priority for r in recs)),
    }


def make_plan(log: RequestLog, inputs: SpecInputs, cfg: PlanConfig) -> dict:
    """Everything ``trtspec plan`` reports, as one JSON-able dict (``policy`` holds the Recommendation)."""
    from trtspec.plan.policy import recommend, recommended_threshold

    stats = log_stats(log)
    recs = log.records
    tokens_per_s = cfg.tokens_per_s or inputs.capacity_tokens_per_s
    hours_off = (
        model.gpu_hours_per_day(stats["requests_per_day"], stats["mean_output_tokens"], tokens_per_s)
        if tokens_per_s and stats["requests_per_day"] is not None
        else None
    )
    load = _load(stats, inputs, cfg, hours_off)
    buckets = _buckets(recs, inputs, load["factor"], cfg.min_gain)
    speedup_of = {b["label"]: b["speedup"] for b in buckets}
    threshold = recommended_threshold([(b["lo"], b["pays"]) for b in buckets])
    rec = recommend(threshold, model.optimal_k(inputs.alpha, inputs.c, 8), inputs.alpha_by_bucket)

    def mix(policy) -> tuple[float, float]:
        router = _router(policy)
        spec = [_speculates(router, r) for r in recs]
        sp = [speedup_of[bucket_of(r.prompt_tokens).label] if s else 1.0 for r, s in zip(recs, spec, strict=True)]
        share = sum(spec) / len(recs)
        return model.overall_speedup([r.output_tokens for r in recs], sp), share

    cur_threshold = cfg.threshold if cfg.threshold is not None else current_threshold(cfg.current_policy)
    overall_current, spec_share_current = mix(cfg.current_policy)
    recommended_policy = next(iter(rec.stages.values()))
    overall_recommended, spec_share_recommended = mix(rec.stages.get("full", recommended_policy))
    overall_all = model.overall_speedup([r.output_tokens for r in recs],
                                        [speedup_of[bucket_of(r.prompt_tokens).label] for r in recs])
    return {
        "log": stats,
        "inputs": inputs.to_dict(),
        "load": load,
        "buckets": buckets,
        "threshold": _thresholds(recs, cur_threshold, threshold, cfg.min_gain),
        "speedup": {
            "current_policy": overall_current,
            "current_policy_speculating_share": spec_share_current,
            "recommended_policy": overall_recommended,
            "recommended_policy_speculating_share": spec_share_recommended,
            "all_speculate": overall_all,
        },
        "roi": _roi(cfg, inputs, hours_off, overall_recommended) if hours_off is not None else None,
        "policy": rec,
    }


def _load(stats: dict, inputs: SpecInputs, cfg: PlanConfig, hours_off: float | None) -> dict:
    """The request rate one server sees (given, else the logged rate over the GPUs that carry it) and
    the factor the bench's load curve puts on the unloaded speedup there."""
    if cfg.rate_per_gpu is not None:
        rate_per_gpu, rate_source = cfg.rate_per_gpu, "--rate-per-gpu"
    elif stats["requests_per_s"] is not None:
        gpus = model.gpus_needed(hours_off) if hours_off is not None else 1
        rate_per_gpu, rate_source = stats["requests_per_s"] / gpus, f"logged rate / {gpus} GPU(s)"
    else:
        rate_per_gpu, rate_source = None, "unknown (one timestamp)"
    pts = [(p.rate, p.speedup) for p in inputs.points if p.speedup]
    return {
        "rate_per_gpu": rate_per_gpu,
        "rate_source": rate_source,
        "factor": model.load_factor(pts, rate_per_gpu) if rate_per_gpu is not None else 1.0,
        "extrapolated": len(pts) >= 2 and rate_per_gpu is not None
        and not (min(r for r, _ in pts) <= rate_per_gpu <= max(r for r, _ in pts)),
        "break_even_rate": model.break_even_rate(pts),
    }


def _buckets(recs: list, inputs: SpecInputs, factor: float, min_gain: float) -> list[dict]:
    """Per prompt-length bucket: its requests and tokens, its acceptance, and the speedup there."""
    total_tokens = sum(r.output_tokens for r in recs) or 1
    buckets = []
    for b in BUCKETS:
        in_b = [r for r in recs if b.holds(r.prompt_tokens)]
        alpha_b = inputs.alpha_by_bucket.get(b.label, inputs.alpha)
        unloaded = model.leviathan_speedup(alpha_b, inputs.k, inputs.c)
        buckets.append({
            "label": b.label,
            "lo": b.lo,
            "hi": None if b.hi == float("inf") else int(b.hi),
            "requests": len(in_b),
            "share_requests": len(in_b) / len(recs),
            "output_tokens": sum(r.output_tokens for r in in_b),
            "share_output_tokens": sum(r.output_tokens for r in in_b) / total_tokens,
            "alpha": alpha_b,
            "alpha_source": "bucket" if b.label in inputs.alpha_by_bucket else "overall",
            "speedup_unloaded": unloaded,
            "speedup": unloaded * factor,
            "pays": unloaded * factor >= 1.0 + min_gain,
        })
    return buckets


def _thresholds(recs: list, current: int, recommended: int | None, min_gain: float) -> dict:
    """The current and the recommended threshold, with the shares of requests and output tokens above each."""
    total_tokens = sum(r.output_tokens for r in recs) or 1
    above = [r for r in recs if r.prompt_tokens > current]
    above_rec = [r for r in recs if recommended is not None and r.prompt_tokens > recommended]
    return {
        "current": current,
        "share_requests_above_current": len(above) / len(recs),
        "share_output_tokens_above_current": sum(r.output_tokens for r in above) / total_tokens,
        "recommended": recommended,
        "share_requests_above_recommended": len(above_rec) / len(recs) if recommended is not None else 0.0,
        "share_output_tokens_above_recommended": (sum(r.output_tokens for r in above_rec) / total_tokens)
        if recommended is not None else 0.0,
        "min_gain": min_gain,
    }


def _roi(cfg: PlanConfig, inputs: SpecInputs, hours_off: float, overall: float) -> dict:
    """GPU hours a day off and with the recommended policy, and what the difference saves."""
    tokens_per_s = cfg.tokens_per_s or inputs.capacity_tokens_per_s
    source = "--tokens-per-s" if cfg.tokens_per_s else ("bench (most tokens/s of a run without errors)" if tokens_per_s else None)
    hours_on = hours_off / overall
    saved = hours_off - hours_on
    return {
        "tokens_per_s": tokens_per_s,
        "tokens_per_s_source": source,
        "gpu_hours_per_day_off": hours_off,
        "gpu_hours_per_day_on": hours_on,
        "saved_gpu_hours_per_day": saved,
        "gpu_price_per_hour": cfg.gpu_price,
        "saved_per_day": saved * cfg.gpu_price if cfg.gpu_price is not None else None,
        "saved_per_year": saved * cfg.gpu_price * 365 if cfg.gpu_price is not None else None,
    }


def plan_by_drafter(log: RequestLog, inputs: dict[str, SpecInputs], cfg: PlanConfig) -> dict:
    """:func:`make_plan` with the drafter whose recommended policy gives the highest overall speedup, plus
    ``by_drafter``: every drafter's inputs and overall speedups, the recommended one marked."""
    plans = {name: make_plan(log, drafter_inputs, cfg) for name, drafter_inputs in inputs.items()}
    best = max(plans, key=lambda name: plans[name]["speedup"]["recommended_policy"])
    return plans[best] | {"by_drafter": {name: _drafter_figures(plan, name == best) for name, plan in plans.items()}}


def _drafter_figures(plan: dict, recommended: bool) -> dict:
    inp, sp = plan["inputs"], plan["speedup"]
    return {
        "alpha": inp["alpha"],
        "c": inp["c"],
        "k": inp["k"],
        "acceptance_rate": inp["acceptance_rate"],
        "speedup_recommended_policy": sp["recommended_policy"],
        "speedup_all_speculate": sp["all_speculate"],
        "recommended": recommended,
    }


def explicit_inputs(alpha: float, c: float, k: int | None) -> SpecInputs:
    if not 0.0 <= alpha <= 1.0:
        raise PlanError(f"--alpha must be in [0, 1], got {alpha}")
    if c < 0:
        raise PlanError(f"--c must be >= 0, got {c}")
    k = k or DEFAULT_K
    return SpecInputs(alpha=alpha, c=c, k=k, source="flags", acceptance_rate=model.acceptance_rate(alpha, k))


def resolve_inputs(bench_paths: Sequence[Path], cfg: PlanConfig) -> dict[str, SpecInputs]:
    """Inputs by drafter from bench results, with ``--alpha`` / ``--c`` / ``--k`` overriding what they
    measured; from the flags alone, one entry (``default``: the server's default_drafter)."""
    if cfg.k is not None and cfg.k < 1:
        raise PlanError(f"--k must be >= 1, got {cfg.k}")
    if not bench_paths:
        if cfg.alpha is None or cfg.c is None:
            raise PlanError("need the measured acceptance and cost ratio: --bench RESULTS.json, or --alpha and --c")
        return {DEFAULT_DRAFTER: explicit_inputs(cfg.alpha, cfg.c, cfg.k)}
    from trtspec.bench.report import load_result

    by_drafter = bench_inputs_by_drafter([(str(p), load_result(p)) for p in bench_paths], cfg.k)
    return {name: _overridden(inputs, cfg) for name, inputs in by_drafter.items()}


def _overridden(inputs: SpecInputs, cfg: PlanConfig) -> SpecInputs:
    """``inputs`` with ``--alpha`` / ``--c`` in place of what bench measured."""
    if cfg.alpha is not None or cfg.c is not None:
        override = explicit_inputs(cfg.alpha if cfg.alpha is not None else inputs.alpha,
                                   cfg.c if cfg.c is not None else inputs.c, inputs.k)
        inputs.alpha, inputs.c = override.alpha, override.c
        if cfg.alpha is not None:
            inputs.alpha_by_bucket = {}
        inputs.source += " (overridden: " + ", ".join(
            n for n, v in (("--alpha", cfg.alpha), ("--c", cfg.c)) if v is not None) + ")"
    return inputs
