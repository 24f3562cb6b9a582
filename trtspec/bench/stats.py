"""Figures of a bench run: per arm and overall, from the per-request records.

Definitions (the report and ``docs/bench_plan.md`` use these words):

- **sent**: requests that went on the wire; **answered**: those with a final
  response; **errors**: those that ended with an error (timeout, refused, ...),
  by category. ``sent == answered + errors`` always: a sent request with
  neither outcome would be a request lost by the client, and :func:`summarize`
  raises.
- Percentiles (p50, p90, p99) by linear interpolation (numpy's default).
  TTFT and end-to-end latency over answered requests; inter-token latency over
  chunks (see :mod:`trtspec.bench.records`).
- **tokens/s**: output tokens of answered requests / the run's wall time
  (first send to last answer); each arm over the same wall time.
- **goodput**: answered requests meeting the SLO (TTFT <= ``slo_ttft_ms`` and
  TPOT <= ``slo_itl_ms``, each when given) per second of wall time;
  **SLO attainment**: their share of the arm's SENT requests (errors miss it).
- **acceptance**: accepted / drafted over the arm's answered requests.
- **speculated share**: of an arm's answered requests, those that drafted at
  least one token; for ``auto`` this shows whether the server let speculation
  run. **Fallback ratio**: speculating requests that fell back to the target
  alone / requests routed to speculate, from the server's counters
  (``trtspec_fallback_requests_total``, ``trtspec_route_decisions_total``) when
  it exports them; None otherwise.
- **ms per token**: a request's end-to-end latency / its output tokens; the
  measured speedup of a speculating arm is the off arm's median over its own.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence

import numpy as np

from trtspec.bench.records import CATEGORIES, RequestRecord

PERCENTILES = (50, 90, 99)


def percentiles(values: Sequence[float]) -> dict[str, float | None]:
    if not values:
        return {f"p{p}": None for p in PERCENTILES} | {"mean": None, "n": 0}
    arr = np.asarray(values, dtype=float)
    out: dict[str, float | None] = {f"p{p}": float(np.percentile(arr, p)) for p in PERCENTILES}
    out["mean"] = float(arr.mean())
    out["n"] = int(arr.size)
    return out


def _median(values: Sequence[float]) -> float | None:
    return float(np.median(values)) if len(values) else None


def meets_slo(r: RequestRecord, slo_ttft_ms: float | None, slo_itl_ms: float | None) -> bool:
    if not r.answered:
        return False
    if slo_ttft_ms is not None and (r.ttft_s is None or r.ttft_s * 1000 > slo_ttft_ms):
        return False
    if slo_itl_ms is not None:
        tpot = r.tpot_s
        if tpot is not None and tpot * 1000 > slo_itl_ms:
            return False
    return True


def wall_time(records: Sequence[RequestRecord]) -> float:
    sent = [r.sent_s for r in records if r.sent_s is not None]
    done = [r.done_s for r in records if r.done_s is not None]
    if not sent or not done:
        return 0.0
    return max(done) - min(sent)


def arm_summary(
    records: Sequence[RequestRecord], wall_s: float, slo_ttft_ms: float | None, slo_itl_ms: float | None
) -> dict:
    sent = [r for r in records if r.sent]
    answered = [r for r in sent if r.answered]
    errors = [r for r in sent if r.error is not None]  # a sent request with neither is unaccounted for
    by_cat = Counter(r.error_category or "other" for r in errors)
    tokens = sum(r.output_tokens for r in answered)
    drafted = sum(r.drafted for r in answered)
    accepted = sum(r.accepted for r in answered)
    good = [r for r in answered if meets_slo(r, slo_ttft_ms, slo_itl_ms)]
    itl = [x for r in answered for x in r.itl_s()]
    speculating = [r for r in answered if r.speculated]
    return {
        "sent": len(sent),
        "answered": len(answered),
        "errors": len(errors),
        "errors_by_category": {c: by_cat[c] for c in CATEGORIES if by_cat[c]},
        "ttft_ms": _ms(percentiles([r.ttft_s for r in answered if r.ttft_s is not None])),
        "itl_ms": _ms(percentiles(itl)),
        "tpot_ms": _ms(percentiles([r.tpot_s for r in answered if r.tpot_s is not None])),
        "e2e_ms": _ms(percentiles([r.e2e_s for r in answered if r.e2e_s is not None])),
        "ms_per_token_p50": _opt_ms(_median([r.e2e_s / r.output_tokens for r in answered if r.output_tokens and r.e2e_s])),
        "output_tokens": tokens,
        "tokens_per_s": tokens / wall_s if wall_s > 0 else 0.0,
        "goodput_rps": len(good) / wall_s if wall_s > 0 else 0.0,
        "goodput_tokens_per_s": sum(r.output_tokens for r in good) / wall_s if wall_s > 0 else 0.0,
        "slo_attainment": len(good) / len(sent) if sent else None,
        "drafted": drafted,
        "accepted": accepted,
        "acceptance_rate": accepted / drafted if drafted else None,
        "speculated_share": len(speculating) / len(answered) if answered else None,
        "k_estimate": estimate_k(speculating),
        "tokens_per_chunk": tokens / sum(len(r.chunks) for r in answered) if any(r.chunks for r in answered) else None,
        # Median over requests of the mean interval between chunks: one draft-verify iteration
        # (speculating) or one target step (off). Per request, so chunks delivered in bursts do not bias it.
        "chunk_interval_ms_p50": _opt_ms(_median([r.mean_chunk_interval_s() for r in answered
                                                  if r.mean_chunk_interval_s() is not None])),
        "lag_ms": _ms(percentiles([r.lag_s for r in sent if r.lag_s is not None])),
    }


def _ms(p: dict) -> dict:
    return {k: (v * 1000 if isinstance(v, float) and k != "n" else v) for k, v in p.items()}


def _opt_ms(v: float | None) -> float | None:
    return None if v is None else v * 1000


def estimate_k(records: Sequence[RequestRecord]) -> int | None:
    """Drafted tokens per iteration, from speculating requests: the median of ceil(drafted / (chunks - 1)).

    One chunk is one iteration; the first is the target's prefill, which never
    drafts (:mod:`trtspec.decoding.loop`), so it does not count. The ceiling undoes the
    last iteration, which the token budget clips (it drafts at most budget - 1)."""
    ks = [math.ceil(r.drafted / (len(r.chunks) - 1) - 1e-9)
          for r in records if r.answered and r.drafted and len(r.chunks) >= 2]
    return int(np.median(ks)) if ks else None


def acceptance_by_position_estimate(records: Sequence[RequestRecord], max_positions: int = 16) -> dict | None:
    """Per draft position i: the share of iterations whose first i drafts were all accepted,
    estimated from stream chunks (tokens per chunk - 1 = accepted, see
    :func:`~trtspec.bench.records.chunk_tokens`); the first chunk of each request (the
    prefill's token, no draft) and the last (the budget may cut it short) are left out.
    Meaningful when k is constant; None without speculating requests."""
    spec = [r for r in records if r.answered and r.speculated and len(r.chunks) >= 3]
    chunks = sum(len(r.chunks) for r in spec)
    if not chunks:
        return None
    k = max(1, min(max_positions, estimate_k(spec) or 1))  # no chunk can have more than k accepted
    accepted_counts = [min(k, t - 1) for r in spec for t in r.chunk_tokens()[1:-1]]
    if not accepted_counts:
        return None
    n = len(accepted_counts)
    return {
        "source": "estimate from stream chunks",
        "iterations": n,
        "by_position": {str(i): sum(1 for a in accepted_counts if a >= i) / n for i in range(1, k + 1)},
    }


def _sum_by(series: dict, name: str) -> dict[str, float]:
    """A counter's increase by ``series`` label set ("drafter=model,position=1") summed by the value of
    label ``name``; label sets without it are left out."""
    out: dict[str, float] = {}
    for labels, v in series.items():
        value = dict(p.split("=", 1) for p in labels.split(",") if "=" in p).get(name)
        if value is not None:
            out[value] = out.get(value, 0.0) + v
    return out


def acceptance_by_position_server(deltas: dict) -> dict | None:
    """Per draft position, accepted / drafted from the server's by-position counters' increase (every
    drafter's together: a run sends one drafter); None when absent."""
    drafted = deltas.get("trtspec_drafted_tokens_by_position_total")
    accepted = deltas.get("trtspec_accepted_tokens_by_position_total")
    if not drafted or not accepted:
        return None
    d, a = _sum_by(drafted, "position"), _sum_by(accepted, "position")
    pos = sorted((p for p in d if d[p] > 0), key=lambda p: int(p.rstrip("+")))
    if not pos:
        return None
    return {"source": "server counters", "by_position": {p: a.get(p, 0.0) / d[p] for p in pos}}


def acceptance_by_drafter(deltas: dict) -> dict | None:
    """Per drafter (model, ngram, suffix), drafted and accepted tokens and their ratio, from the
    increase of the server's drafter-labelled counters; None when absent or nothing was drafted."""
    drafted = deltas.get("trtspec_drafted_tokens_total") or {}
    accepted = deltas.get("trtspec_accepted_tokens_total") or {}
    d, a = _sum_by(drafted, "drafter"), _sum_by(accepted, "drafter")
    rows = {n: {"drafted": d[n], "accepted": a.get(n, 0.0), "acceptance_rate": a.get(n, 0.0) / d[n]}
            for n in sorted(d) if d[n] > 0}
    return rows or None


def fallback_ratio(deltas: dict) -> float | None:
    fb = deltas.get("trtspec_fallback_requests_total")
    routes = deltas.get("trtspec_route_decisions_total")
    if fb is None or routes is None:
        return None
    spec = sum(v for k, v in routes.items() if "route=speculate" in k)
    return sum(fb.values()) / spec if spec else None


def summarize(
    records: Sequence[RequestRecord],
    *,
    arms: Sequence[str],
    slo_ttft_ms: float | None = None,
    slo_itl_ms: float | None = None,
    server_deltas: dict | None = None,
) -> dict:
    """Overall and per-arm figures; raises ``AssertionError`` if a sent request is unaccounted for."""
    wall = wall_time(records)
    overall = arm_summary(records, wall, slo_ttft_ms, slo_itl_ms)
    assert overall["sent"] == overall["answered"] + overall["errors"], "a sent request is unaccounted for"
    by_arm = {a: arm_summary([r for r in records if r.arm == a], wall, slo_ttft_ms, slo_itl_ms) for a in arms}
    assert sum(s["sent"] for s in by_arm.values()) == overall["sent"], "a request belongs to no arm"
    deltas = server_deltas or {}
    off = by_arm.get("off")
    speedup = {}
    for a in arms:
        if a != "off" and off and off["ms_per_token_p50"] and by_arm[a]["ms_per_token_p50"]:
            speedup[a] = off["ms_per_token_p50"] / by_arm[a]["ms_per_token_p50"]
    sent_times = [r.sent_s for r in records if r.sent_s is not None]
    span = (max(sent_times) - min(sent_times)) if len(sent_times) > 1 else 0.0
    return {
        "wall_s": wall,
        "accounted": overall["sent"] == overall["answered"] + overall["errors"],
        "overall": overall,
        "by_arm": by_arm,
        "speedup_vs_off": speedup,
        "achieved_send_rate_rps": (len(sent_times) - 1) / span if span > 0 else None,
        "fallback_ratio": fallback_ratio(deltas),
        "acceptance_by_drafter": acceptance_by_drafter(deltas),
        "acceptance_by_position": acceptance_by_position_server(deltas) or acceptance_by_position_estimate(records),
    }
