"""The planner's arithmetic: Leviathan's speedup, alpha from an acceptance rate, the load correction, ROI.

Leviathan, Kalman, Matias, "Fast Inference from Transformers via Speculative
Decoding" (ICML 2023). With ``alpha`` the probability that the target accepts a
drafted token (i.i.d. per position), ``k`` drafted tokens per iteration (the
paper's gamma) and ``c`` the cost of one draft step in target steps:

    E[tokens per iteration] = (1 - alpha^(k+1)) / (1 - alpha)        (Eq. 1)
    speedup                 = E[tokens] / (k c + 1)                  (Thm 3.8)

The ``+ 1`` is the verification pass, costed as one target step (the paper's
assumption); :func:`effective_c` folds a verify pass dearer than that into
``c`` as bench measures it.

Under the same model the acceptance rate a server reports (accepted /
drafted, prefix acceptance) is

    rate(alpha, k) = (alpha + alpha^2 + ... + alpha^k) / k

increasing in alpha, so :func:`alpha_from_rate` inverts it by bisection.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence


def expected_tokens(alpha: float, k: int) -> float:
    """E[tokens emitted per iteration] (bonus/correction token included), Leviathan Eq. 1."""
    assert 0.0 <= alpha <= 1.0 and k >= 0, (alpha, k)
    if alpha >= 1.0:
        return k + 1.0
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


def leviathan_speedup(alpha: float, k: int, c: float) -> float:
    """Expected walltime improvement of speculative decoding (Leviathan et al. 2023, Thm 3.8)."""
    assert c >= 0.0, c
    return expected_tokens(alpha, k) / (k * c + 1.0)


def acceptance_rate(alpha: float, k: int) -> float:
    """accepted / drafted under the i.i.d. model with prefix acceptance."""
    assert k >= 1
    return sum(alpha**i for i in range(1, k + 1)) / k


def alpha_from_rate(rate: float, k: int, tol: float = 1e-10) -> float:
    """The alpha whose :func:`acceptance_rate` at ``k`` is ``rate`` (bisection; exact for k = 1)."""
    assert 0.0 <= rate <= 1.0 and k >= 1, (rate, k)
    if k == 1 or rate in (0.0, 1.0):
        return rate
    lo, hi = 0.0, 1.0
    while hi - lo > tol:
        mid = (lo + hi) / 2
        if acceptance_rate(mid, k) < rate:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def effective_c(iteration_s: float, target_step_s: float, k: int) -> float:
    """The cost ratio that makes one iteration cost ``k c + 1`` target steps, as measured:
    ``(iteration time / target step - 1) / k``, at least 0. Verification dearer than one
    target step (as on CPUs) shows up here, not in a separate term."""
    assert target_step_s > 0 and k >= 1
    return max(0.0, (iteration_s / target_step_s - 1.0) / k)


def optimal_k(alpha: float, c: float, k_max: int = 8) -> int:
    """The k in 1..k_max with the highest expected speedup (ties: the smaller k)."""
    return max(range(1, k_max + 1), key=lambda k: (leviathan_speedup(alpha, k, c), -k))


def load_factor(points: Sequence[tuple[float, float]], rate: float) -> float:
    """How much of the unloaded speedup survives at ``rate``.

    ``points`` are (request rate, measured speedup) from bench runs. The factor
    is the measured speedup at ``rate`` (linear interpolation between the
    points; the nearest point's value outside them) divided by the speedup at
    the lowest rate measured. With no points it is 1.
    """
    if not points:
        return 1.0
    pts = sorted(points)
    base = pts[0][1]
    assert base > 0, "measured speedup must be > 0"
    rates = [r for r, _ in pts]
    if rate <= rates[0]:
        return 1.0
    if rate >= rates[-1]:
        return pts[-1][1] / base
    i = bisect.bisect_right(rates, rate)
    (r0, s0), (r1, s1) = pts[i - 1], pts[i]
    s = s0 + (s1 - s0) * (rate - r0) / (r1 - r0) if r1 > r0 else s1
    return s / base


def break_even_rate(points: Sequence[tuple[float, float]]) -> float | None:
    """The lowest request rate at which the measured speedup falls to 1 (interpolated), or None
    when it never does within the points (or already is below 1 at the lowest)."""
    pts = sorted(points)
    for (r0, s0), (r1, s1) in zip(pts, pts[1:]):
        if s0 >= 1.0 > s1:
            return r0 + (r1 - r0) * (s0 - 1.0) / (s0 - s1)
    return None


def overall_speedup(tokens: Sequence[float], speedups: Sequence[float]) -> float:
    """Speedup of a mix: total time without speculation / with, where each part's time is
    proportional to its tokens and divided by its speedup (a token-weighted harmonic mean)."""
    total = sum(tokens)
    with_spec = sum(t / s for t, s in zip(tokens, speedups, strict=True))
    return total / with_spec if with_spec > 0 else 1.0


def gpu_hours_per_day(requests_per_day: float, mean_output_tokens: float, tokens_per_s: float) -> float:
    """GPU-hours a day of generation: requests/day x mean output tokens / (tokens/s per GPU) / 3600."""
    assert tokens_per_s > 0
    return requests_per_day * mean_output_tokens / tokens_per_s / 3600.0


def gpus_needed(hours_per_day: float) -> int:
    """Whole GPUs that carry ``hours_per_day`` of work (at least one)."""
    return max(1, math.ceil(hours_per_day / 24.0 - 1e-9))
