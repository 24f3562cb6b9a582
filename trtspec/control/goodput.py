"""The ``goodput`` draft-length controller: pick the ``k`` that emits the most tokens per second.

Rule (Leviathan et al. 2023, "Fast Inference from Transformers via
Speculative Decoding", Sec. 3.1 and Thm. 3.8, generalised from one i.i.d.
acceptance rate ``alpha`` to a conditional acceptance rate per draft position,
and from a constant verify cost to a measured one per ``k``)::

    a_i    = P(draft token i accepted | tokens 1..i-1 accepted)      i = 1..k_max
    E[k]   = 1 + sum_{i=1..k} prod_{j<=i} a_j       expected emitted tokens of one iteration
    T[k]   = k * d + v[k]                           expected seconds of one iteration
    k*     = argmax_{k in 0..k_max} E[k] / T[k]

``d`` is the measured seconds per draft token, ``v[k]`` the measured seconds
of a verify pass over ``k`` drafts (``v[0]`` is a plain target step, so
``E[0] / T[0]`` is the target alone). In Leviathan's notation
``c = d / v[0]``; with i.i.d. ``a_i = alpha`` and ``v[k] = v[0]`` the rule is
exactly the paper's ``(1 - alpha^(k+1)) / ((1 - alpha) (k c + 1))``. A ``k > 0``
is chosen only when it beats ``k = 0`` by more than ``min_gain``: when
nothing pays, the request runs on the target alone.

Estimates (shared by all requests through one :class:`GoodputModel`):

- ``a_i`` from counts that decay over ``memory_iterations`` drafting
  iterations of all requests (and ten times slower over target-only ones, so
  that a long stretch without drafting lets old evidence fade too), shrunk
  with ``prior_strength`` pseudo-tokens to a prior that is
  ``prior_acceptance`` for position 1 and the estimate of position ``i - 1``
  for position ``i`` (a position seldom drafted is assumed to behave like the
  one before it, not like a fixed guess). Each request then scales the odds of every ``a_i`` by how its
  own pooled acceptance compares with everyone's (empirical Bayes: the
  request's own evidence is weighed against a prior whose strength is fitted to
  how much requests have differed from each other), so a request with a draft
  that disagrees stops drafting after one or two iterations even when most
  requests speculate well, and the reverse.
- ``d`` and ``v[k]`` as medians of the last ``timing_window`` measured times
  (a median, because a step the OS preempted is an outlier, not a trend).
  The first iteration of a request is left out (the target's prompt prefill:
  the loop never drafts there), and so is the draft time of an iteration after
  one with ``k = 0`` (the draft then catches up on several tokens; at a
  request's first draft, on the whole prompt). An unmeasured ``v[k]`` is
  guessed optimistically, so that it gets tried (see :class:`CostModel`).
  Before anything is measured, ``d = prior_draft_cost`` and
  ``v[k] = 1 + prior_verify_cost_per_token * k`` in units of a target step.

Exploration, so that estimates do not go stale:

- while speculating, every ``1 / explore_share``-th speculating iteration (of
  all requests) drafts instead the least-measured of: one token more than
  ``k*``, one fewer, none, and a far ``k`` (cycling through ``1..k_max``), to
  keep ``v[k]``, ``v[0]`` and the deeper ``a_i`` measured. Until a plain
  target step has been measured ``MIN_SAMPLES`` times (it is the baseline every
  choice is compared with), every 8th speculating iteration is one;
- while nothing pays, a new request still drafts at its first drafting
  iteration, right after the prefill (where a probe is cheapest: the draft
  only has the prompt to read) when
  acceptance rates drawn from their posteriors say it pays (Thompson
  sampling: often while the evidence is thin or faded, rarely once it is
  clearly against speculating), drafting the ``k`` best for the drawn rates;
  else ``probe_k`` tokens if at least ``min_paying_share`` of recent requests
  had an acceptance at which speculation pays (requests differ: this one may
  be a good one) and the probe is worth what it costs (:meth:`GoodputModel.probe_value`:
  what good requests save over the tokens expected to remain, against the
  draft's read of the context, measured per token at first drafts, and the
  iteration bad ones waste); else a ``probe_share`` of new requests do anyway, so that a
  draft that got better, or a cost measured during a stall, is noticed. Even
  when a ``k > 0`` pays per iteration, a request starts drafting (at its first
  drafting iteration, or when it resumes) only if the saving over the tokens
  expected to remain pays for the draft's read of what it has not seen
  (``not_worth_it`` otherwise; only ``probe_share`` probes still start it). A request that went
  to the target alone drafts again by the means only on measured evidence
  (``RESUME_MIN_EVIDENCE`` tested positions), not on the priors alone: after
  a run of target-only steps the draft must first read everything it missed.
  A request whose draft call failed or was late rests too: its draft restarts
  in a fresh session, so resuming reads the whole context, weighed as above;
- while the model is young (fewer than ``RESUME_MIN_EVIDENCE`` drafts ever tested, and some
  ``k`` would pay at a high enough acceptance), a request that would not draft because nothing
  pays by the means drafts ``probe_k`` tokens anyway (``young``), and a resting one does not
  ``wait``: estimates from a few tokens are the prior and luck, and on a fresh server nobody
  else drafts to measure more. A draft that seldom agrees costs a fresh server those few drafts;
  evidence that faded later is not young (it was measured once: ``wait`` holds);
- while a request that has drafted would not draft by the means, but drafting pays for requests
  in general, each iteration draws its acceptance from its posterior (its own counts, shrunk
  toward everyone's as above) and drafts when the drawn rate pays, the draft's read of what it
  missed included (``redraw``). Its own evidence never changes while it rests, so without this
  one early rejection, against a weak prior, kept it on the target alone to its end.
"""

from __future__ import annotations

import math
import random
import threading
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from trtspec.control.config import GoodputConfig
from trtspec.control.rates import take_share
from trtspec.decoding.types import IterationOutcome

_A_MIN, _A_MAX = 1e-4, 0.995
MIN_SAMPLES = 3  # draft timings needed before the measurement replaces the prior
YOUNG_EXPLORE_EVERY = 8  # explore this often until a plain target step is measured
TARGET_ONLY_MEMORY_FACTOR = 10  # target-only iterations age the acceptance counts this much slower
RESUME_MIN_EVIDENCE = 8.0  # tested draft positions behind a_1 before a request at k = 0 drafts again
# The draft's catch-up (reading a prompt it has not seen) per token, in draft steps, until measured
# (the demo pair's figure: docs/control.md, "goodput").
PRIOR_CATCHUP_PER_DRAFT_STEP = 0.15
DEFAULT_REQUEST_TOKENS = 64  # expected output length before any request has finished


def expected_emitted(a: list[float], k: int) -> float:
    """``E[k] = 1 + sum_{i<=k} prod_{j<=i} a_j``: emitted tokens of one iteration drafting ``k``."""
    total, run = 1.0, 1.0
    for i in range(k):
        run *= a[i]
        total += run
    return total


def best_k(a: list[float], t: list[float], min_gain: float) -> tuple[int, list[float]]:
    """``argmax_k E[k] / T[k]`` over ``k in 0..len(t)-1``; ``0`` unless a ``k > 0`` beats it by ``min_gain``.

    Returns ``(k*, goodput per k)`` (tokens per second, or per unit time).
    """
    assert len(a) >= len(t) - 1
    g = [expected_emitted(a, k) / t[k] for k in range(len(t))]
    k = max(range(1, len(t)), key=lambda j: g[j], default=0)
    if k == 0 or g[k] <= g[0] * (1.0 + min_gain):
        return 0, g
    return k, g


def _odds(p: float) -> float:
    p = min(max(p, _A_MIN), _A_MAX)
    return p / (1.0 - p)


def scale_acceptance(a_global: list[float], pooled_global: float, pooled_request: float) -> list[float]:
    """Per-position acceptance of one request: the global ``a_i`` with their odds
    multiplied by ``odds(pooled_request) / odds(pooled_global)``."""
    ratio = _odds(pooled_request) / _odds(pooled_global)
    out = []
    for p in a_global:
        o = _odds(p) * ratio
        out.append(min(max(o / (1.0 + o), _A_MIN), _A_MAX))
    return out


class _Recent:
    """The last ``size`` samples; their median is the estimate (robust to a preempted step)."""

    __slots__ = ("samples",)

    def __init__(self, size: int) -> None:
        self.samples: deque[float] = deque(maxlen=size)

    def add(self, x: float) -> None:
        self.samples.append(x)

    @property
    def n(self) -> int:
        return len(self.samples)

    @property
    def value(self) -> float | None:
        """The median, or None before ``MIN_SAMPLES`` samples (one stalled step must not decide)."""
        return self.median if len(self.samples) >= MIN_SAMPLES else None

    @property
    def median(self) -> float | None:
        if not self.samples:
            return None
        s = sorted(self.samples)
        mid = len(s) // 2
        return s[mid] if len(s) % 2 else (s[mid - 1] + s[mid]) / 2


class CostModel:
    """Measured iteration times: seconds per draft token ``d`` and per verify pass ``v[k]``. Not locked.

    ``v[k]`` is the median of its recent measurements. Verify cost is not
    smooth in ``k`` on real kernels (on the demo CPU verifying 2 drafts costs
    more than verifying 4), so an unmeasured ``k`` is not interpolated but
    given, optimistically, the cost of the nearest measured smaller ``k``
    (verifying more tokens is assumed to cost no less): the controller then
    tries it, and the measurement replaces the guess. Before any ``k >= 1`` is
    measured, ``v[k] = v[0] (1 + prior_verify_cost_per_token k)``; an
    unmeasured ``v[0]`` is derived from the nearest measured ``k`` the same
    way, and ``d = prior_draft_cost v[0]`` until ``MIN_SAMPLES`` draft steps are
    measured (one stalled step must not decide).
    """

    def __init__(self, k_max: int, config: GoodputConfig) -> None:
        self.k_max = k_max
        self.config = config
        self.draft = _Recent(config.timing_window)
        self.verify = [_Recent(config.timing_window) for _ in range(k_max + 1)]
        self.catchup = _Recent(config.timing_window)  # seconds per token the draft reads at a request's first draft

    def observe_draft(self, seconds_per_token: float) -> None:
        self.draft.add(seconds_per_token)

    def observe_verify(self, k: int, seconds: float) -> None:
        if 0 <= k <= self.k_max:
            self.verify[k].add(seconds)

    def verify_times(self) -> list[float]:
        """``v[k]`` for ``k = 0..k_max``: measured, or guessed as the class docstring says."""
        beta = self.config.prior_verify_cost_per_token
        measured = {k: r.median for k, r in enumerate(self.verify) if r.median is not None}
        drafting = sorted(k for k in measured if k >= 1)
        if 0 in measured:
            v0 = measured[0]
        elif drafting:
            k1 = drafting[0]
            v0 = measured[k1] / (1.0 + beta * k1)
        else:
            v0 = 1.0  # nothing measured: units of a target step
        out = [v0]
        for k in range(1, self.k_max + 1):
            if k in measured:
                out.append(measured[k])
                continue
            below = [j for j in drafting if j < k]
            if below:
                out.append(measured[below[-1]])
            elif drafting:  # only larger k measured: no more than the nearest of them
                out.append(measured[drafting[0]])
            else:
                out.append(v0 * (1.0 + beta * k))
        return [max(v, 1e-9) for v in out]

    def draft_step(self, v0: float) -> float:
        """``d``: measured, else ``prior_draft_cost`` target steps."""
        return self.draft.value if self.draft.value is not None else self.config.prior_draft_cost * v0

    def iteration_times(self) -> list[float]:
        """``T[k] = k d + v[k]`` for ``k = 0..k_max``."""
        v = self.verify_times()
        d = self.draft_step(v[0])
        return [max(k * d + v[k], 1e-9) for k in range(self.k_max + 1)]

    def catchup_per_token(self) -> float:
        """Seconds the draft needs per token it reads before it can draft (its prefill of the context):
        measured at requests' first drafts, else ``PRIOR_CATCHUP_PER_DRAFT_STEP`` draft steps."""
        if self.catchup.value is not None:
            return self.catchup.value
        return PRIOR_CATCHUP_PER_DRAFT_STEP * self.draft_step(self.verify_times()[0])


@dataclass(frozen=True)
class GoodputEstimate:
    """What one request's next choice is based on."""

    acceptance: list[float]  # a_i for i = 1..k_max, this request's
    evidence: float  # tested draft positions behind a_1: everyone's (decayed) plus this request's
    pooled_acceptance: float  # this request's pooled conditional acceptance (shrunk)
    iteration_times: list[float]  # T[k], k = 0..k_max
    k_best: int
    goodput: list[float]  # E[k] / T[k]


class GoodputModel:
    """The estimates all requests share: acceptance per position, step costs,
    and how recent requests differed. Thread-safe."""

    def __init__(self, k_max: int, config: GoodputConfig, rng: random.Random | None = None) -> None:
        self.k_max = k_max
        self.config = config
        self._rng = rng or random.Random(0)
        self._lock = threading.Lock()
        self._decay = 1.0 - 1.0 / config.memory_iterations  # per drafting iteration
        self._decay_idle = 1.0 - 1.0 / (TARGET_ONLY_MEMORY_FACTOR * config.memory_iterations)  # per k = 0 one
        self._accepted = [0.0] * k_max  # decayed count: position i+1 accepted
        self._tested = [0.0] * k_max  # decayed count: position i+1 drafted with 1..i accepted
        self._ever_tested = 0  # drafting iterations ever (position 1 tested), not decayed
        self.costs = CostModel(k_max, config)
        self._history: deque[tuple[int, int]] = deque(maxlen=config.request_history)  # (accepted, tested)
        self._lengths: deque[int] = deque(maxlen=config.request_history)  # tokens emitted per finished request
        self._probe_credit = 0.0
        self._explore_every = math.ceil(1.0 / config.explore_share) if config.explore_share > 0 else 0
        self._spec_iterations = 0
        self._far = 0

    # -- learning ------------------------------------------------------------

    def observe(self, o: IterationOutcome, first: bool, steady_draft: bool, catchup_tokens: int = 0) -> None:
        """Learn from one iteration. ``first``: the request's first (includes prefill);
        ``steady_draft``: the draft's cache was at most two tokens behind;
        ``catchup_tokens``: at a request's first draft, the context the draft read first."""
        with self._lock:
            k = min(o.k, self.k_max)
            decay = self._decay if k > 0 else self._decay_idle
            for i in range(self.k_max):
                self._accepted[i] *= decay
                self._tested[i] *= decay
            for i in range(min(k, o.tested)):
                self._tested[i] += 1.0
            if k > 0 and o.tested > 0:
                self._ever_tested += 1
            for i in range(min(o.accepted, k)):
                self._accepted[i] += 1.0
            if first:
                return
            self.costs.observe_verify(o.k, o.verify_time_s)
            if o.k > 0 and steady_draft:
                self.costs.observe_draft(o.draft_time_s / o.k)
            elif o.k > 0 and catchup_tokens > 0:  # one pass over the context, then k - 1 drafting steps
                d = self.costs.draft_step(self.costs.verify_times()[0])
                self.costs.catchup.add(max(o.draft_time_s - (o.k - 1) * d, 0.0) / catchup_tokens)

    def request_finished(self, accepted: int, tested: int, emitted: int = 0) -> None:
        """Record one finished request's pooled acceptance (``tested``: positions tested)
        and its length (``emitted`` tokens)."""
        with self._lock:
            if tested > 0:
                self._history.append((accepted, tested))
            if emitted > 0:
                self._lengths.append(emitted)

    def expected_remaining(self, max_new_tokens: int, emitted: int) -> float:
        """Tokens a request that has emitted ``emitted`` is expected to emit still: the mean
        length of recent requests (``DEFAULT_REQUEST_TOKENS`` before any), capped by its
        ``max_new_tokens`` (0: unknown)."""
        with self._lock:
            typical = sum(self._lengths) / len(self._lengths) if self._lengths else float(DEFAULT_REQUEST_TOKENS)
        total = min(typical, max_new_tokens) if max_new_tokens > 0 else typical
        return max(total - emitted, 0.0)

    # -- estimates -----------------------------------------------------------

    def _global(self) -> tuple[list[float], float]:
        """Posterior means of ``a_i`` and of the pooled acceptance. The prior of
        position 1 is ``prior_acceptance``; the prior of each deeper position is
        the estimate of the one before it, so a position rarely drafted inherits
        what the shallower ones show instead of a fixed guess."""
        p0, s = self.config.prior_acceptance, self.config.prior_strength
        a: list[float] = []
        prior = p0
        for acc, t in zip(self._accepted, self._tested):
            prior = (acc + s * prior) / (t + s)
            a.append(prior)
        pooled = (sum(self._accepted) + s * p0) / (sum(self._tested) + s)
        return a, pooled

    def _request_prior_strength(self) -> float:
        """Empirical Bayes (method of moments): how many tokens of its own a
        request needs before its evidence outweighs everyone's. Small when
        recent requests differed a lot from each other, large when alike."""
        hist = [(acc, t) for acc, t in self._history if t >= 3]
        if len(hist) < 5:
            return self.config.request_prior_strength
        mu = sum(acc for acc, _ in hist) / sum(t for _, t in hist)
        spread = sum((acc / t - mu) ** 2 for acc, t in hist) / len(hist)
        noise = sum(mu * (1.0 - mu) / t for _, t in hist) / len(hist)
        between = max(spread - noise, 1e-4)
        return min(50.0, max(0.5, mu * (1.0 - mu) / between - 1.0))

    def estimate(self, accepted: int, tested: int, draw: bool = False) -> GoodputEstimate:
        """The estimate for a request that has so far had ``accepted`` of ``tested`` positions accepted;
        with ``draw``, its pooled acceptance is drawn from its posterior (Thompson sampling) instead
        of taken at the posterior's mean."""
        with self._lock:
            a_g, pooled_g = self._global()
            m = self._request_prior_strength()
            t = self.costs.iteration_times()
            evidence = self._tested[0] + tested
            if draw:
                pooled_r = self._rng.betavariate(accepted + m * pooled_g, tested - accepted + m * (1.0 - pooled_g))
        if not draw:
            pooled_r = (accepted + m * pooled_g) / (tested + m)
        a_r = scale_acceptance(a_g, pooled_g, pooled_r)
        k, g = best_k(a_r, t, self.config.min_gain)
        return GoodputEstimate(a_r, evidence, pooled_r, t, k, g)

    def _pays(self) -> Callable[[float], bool]:
        """``pays(p)``: some ``k > 0`` pays, at the estimates as they are now, for a request whose
        pooled acceptance is ``p``."""
        with self._lock:
            a_g, pooled_g = self._global()
            t = self.costs.iteration_times()
        return lambda p: best_k(scale_acceptance(a_g, pooled_g, p), t, self.config.min_gain)[0] > 0

    def breakeven_acceptance(self) -> float:
        """The lowest pooled acceptance at which some ``k > 0`` pays (1.0: none does)."""
        pays = self._pays()
        if not pays(_A_MAX):
            return 1.0
        lo, hi = 0.0, _A_MAX
        for _ in range(30):
            mid = (lo + hi) / 2
            if pays(mid):
                hi = mid
            else:
                lo = mid
        return hi

    def paying_share(self) -> float:
        """Share of recent requests whose acceptance (shrunk toward everyone's as
        in :meth:`estimate`) would make speculation pay now; 1.0 with no history."""
        a_be = self.breakeven_acceptance()
        with self._lock:
            hist = list(self._history)
            _, pooled_g = self._global()
            m = self._request_prior_strength()
        if not hist:
            return 1.0
        mu = sum(acc for acc, _ in hist) / sum(t for _, t in hist)
        return sum(1 for acc, t in hist if (acc + m * mu) / (t + m) > a_be) / len(hist)

    def sampled_k(self) -> int:
        """Thompson sampling: the best ``k`` for acceptance rates drawn from their
        posteriors (``Beta`` of the decayed counts and the prior) instead of their
        means. Positive with a probability that shrinks as the evidence against
        speculating grows; thin or faded evidence makes it positive often. (Not
        weighed against the probe's cost: what it buys is mostly knowledge for
        the requests that follow.)"""
        s = self.config.prior_strength
        with self._lock:
            a = []
            prior = self.config.prior_acceptance
            for acc, tested in zip(self._accepted, self._tested):  # priors chained as in _global
                a.append(self._rng.betavariate(acc + s * prior, max(tested - acc, 0.0) + s * (1.0 - prior)))
                prior = (acc + s * prior) / (tested + s)
            t = self.costs.iteration_times()
        return best_k(a, t, self.config.min_gain)[0]

    def catchup_per_token(self) -> float:
        """Seconds the draft needs per token it reads before drafting (see :class:`CostModel`)."""
        with self._lock:
            return self.costs.catchup_per_token()

    def probe_value(self, catchup_tokens: int, remaining: float, probe_k: int) -> float:
        """Expected seconds a new request saves by probing with ``probe_k`` drafts now (negative: it loses).

        Recent requests stand for what this one may be (each with its acceptance
        shrunk toward everyone's, as in :meth:`estimate`). One at which some
        ``k`` pays would, once found, save ``remaining / g[0] - remaining / g[k]``
        seconds, less the draft's catch-up on the context (``catchup_tokens``
        times the measured seconds per token); one at which nothing pays loses
        the catch-up and the probe iteration's extra time, less the tokens it
        gained. The mean over recent requests (the global estimate when there
        are none) is the value of the information the probe buys."""
        with self._lock:
            a_g, pooled_g = self._global()
            m = self._request_prior_strength()
            t = self.costs.iteration_times()
            catchup = catchup_tokens * self.costs.catchup_per_token()
            hist = list(self._history)
        if hist:
            mu = sum(acc for acc, _ in hist) / sum(n for _, n in hist)
            pooled = [(acc + m * mu) / (n + m) for acc, n in hist]
        else:
            pooled = [pooled_g]
        kp = max(1, min(probe_k, self.k_max))
        total = 0.0
        for p in pooled:
            a = scale_acceptance(a_g, pooled_g, p)
            k, g = best_k(a, t, self.config.min_gain)
            if k > 0:
                total += remaining / g[0] - remaining / g[k] - catchup
            else:
                total -= catchup + t[kp] - t[0] - (expected_emitted(a, kp) - 1.0) * t[0]
        return total / len(pooled)

    def young(self) -> bool:
        """Fewer than ``RESUME_MIN_EVIDENCE`` drafts were ever tested, and some ``k`` would pay at a
        high enough acceptance: the estimates are still the priors and a few tokens' luck."""
        with self._lock:
            if self._ever_tested >= RESUME_MIN_EVIDENCE:
                return False
        return self._pays()(_A_MAX)

    def requests_differ(self) -> bool:
        """True when at least ``min_paying_share`` of recent requests had an acceptance
        at which speculation pays now: a new request may be one of them."""
        return self.config.min_paying_share > 0 and self.paying_share() >= self.config.min_paying_share

    def explore(self, k_best: int) -> int | None:
        """Called once per iteration a request would draft ``k_best > 0``; returns
        the ``k`` to draft instead when this iteration explores, else None."""
        with self._lock:
            if not self._explore_every:
                return None
            self._spec_iterations += 1
            young = self.costs.verify[0].n < MIN_SAMPLES
            if self._spec_iterations % (YOUNG_EXPLORE_EVERY if young else self._explore_every):
                return None
            if young:
                return 0
            self._far = self._far % self.k_max + 1
            candidates = [c for c in (k_best + 1, k_best - 1, 0, self._far) if 0 <= c <= self.k_max and c != k_best]
            return min(candidates, key=lambda c: self.costs.verify[c].n)  # first of the least measured

    def take_probe_credit(self) -> bool:
        """True for a ``probe_share`` of the calls (a deterministic accumulator)."""
        with self._lock:
            self._probe_credit, taken = take_share(self._probe_credit, self.config.probe_share)
            return taken

    def snapshot(self) -> dict:
        with self._lock:
            a_g, pooled_g = self._global()
            t = self.costs.iteration_times()
            m = self._request_prior_strength()
            d = self.costs.draft.value
            v0 = self.costs.verify[0].value
            catchup = self.costs.catchup.value
            lengths = list(self._lengths)
        return {
            "acceptance_per_position": [round(x, 4) for x in a_g],
            "pooled_acceptance": round(pooled_g, 4),
            "iteration_time_s": [round(x, 6) for x in t],
            "draft_token_s": d,
            "target_step_s": v0,
            "draft_cost_ratio": (d / v0) if d is not None and v0 else None,
            "draft_catchup_token_s": catchup,
            "mean_request_tokens": round(sum(lengths) / len(lengths), 1) if lengths else None,
            "request_prior_strength": round(m, 3),
            "k_best_now": best_k(a_g, t, self.config.min_gain)[0],
            "breakeven_acceptance": round(self.breakeven_acceptance(), 4),  # 1.0: no acceptance pays
            "young": self.young(),  # still buying its first measured drafts (see the module docstring)
        }


class GoodputController:
    """Per-request ``goodput`` controller over a shared :class:`GoodputModel` (see the module docstring)."""

    def __init__(self, model: GoodputModel, k_max: int, config: GoodputConfig, max_new_tokens: int = 0) -> None:
        self.model = model
        self.k_max = min(k_max, model.k_max)
        self.config = config
        self.max_new_tokens = max_new_tokens  # 0: unknown
        self._emitted = 0
        self._context = 0  # tokens in the sequence now
        self._draft_seen = 0  # tokens of the sequence the draft has read (0: it has not drafted yet)
        self._accepted = 0  # this request: drafted positions accepted
        self._tested = 0  # this request: drafted positions tested (up to and including the first rejection)
        self._observed = 0
        self._decided = 0  # next_k calls: the loop asks none for the request's prefill iteration
        self._prev_k: int | None = None  # k of the last iteration the loop ran
        self._resting = False  # the last k returned was 0 because nothing paid (or not enough)
        self._drawn: tuple[int, float] | None = None  # this iteration's redraw (k, gain), once made
        # why the last k was chosen: best | nothing_pays | not_worth_it | probe | explore | wait | redraw
        self.last_reason = "start"

    @property
    def first_decision(self) -> bool:
        """This request has not asked this controller for a ``k`` yet."""
        return self._decided == 0

    def next_k(self) -> int:
        k = self._choose()
        self._decided += 1
        self._resting = self.last_reason in ("nothing_pays", "wait", "not_worth_it")
        return k

    def _start_value(self, est: GoodputEstimate, k: int) -> float:
        """Expected seconds this request saves by starting (or resuming) to draft ``k`` now:
        with evidence of its own, what drafting at its estimated rates saves over the tokens
        expected to remain, less the draft's read of the tokens it has not seen; before that,
        the same over recent requests as stand-ins (:meth:`GoodputModel.probe_value`)."""
        remaining = self.model.expected_remaining(self.max_new_tokens, self._emitted)
        unseen = max(self._context - self._draft_seen, 0)
        if self._tested == 0:
            return self.model.probe_value(unseen, remaining, k)
        g = est.goodput
        return remaining / g[0] - remaining / g[k] - unseen * self.model.catchup_per_token()

    def _held(self, est: GoodputEstimate, k: int) -> str | None:
        """Why this request does not start (or resume) drafting ``k > 0`` now, though it pays per
        iteration (``wait`` | ``not_worth_it``); None when it drafts."""
        if self._resting and est.evidence < RESUME_MIN_EVIDENCE and not self.model.young():
            # after target-only steps, drafting again costs the draft a read of
            # everything it missed: do it on measurements, not on the priors alone
            # (on a young model there is nothing to wait for: nobody else drafts)
            return "wait"
        if (self._resting or self._decided == 0) and self._start_value(est, k) <= 0:
            # drafting pays per iteration, but not enough, over what is left, to pay
            # for the draft's read of what it has not seen (at a first draft: the prompt)
            return "not_worth_it"
        return None

    def _choose(self) -> int:
        est = self.model.estimate(self._accepted, self._tested)
        k = min(est.k_best, self.k_max)
        reason = "nothing_pays"
        held = self._held(est, k) if k > 0 else None
        if held is not None:
            k, reason = 0, held
        redrawn = self._redraw()[0] if k == 0 else 0
        if redrawn > 0:
            self.last_reason = "redraw"
            return redrawn
        if reason == "wait":
            self.last_reason = "wait"
            return 0
        if k == 0 and reason == "nothing_pays" and self.model.young():
            # a few tokens' luck says nothing pays: buy the evidence before believing it
            self.last_reason = "young"
            return min(self.config.probe_k, self.k_max)
        if k == 0:
            if self._decided == 0:  # a new request's first draft: the cheapest moment to probe
                if reason == "nothing_pays":  # (not_worth_it: drafting pays, but not for this read)
                    sampled = self.model.sampled_k()
                    if sampled > 0:
                        self.last_reason = "probe"
                        return min(sampled, self.k_max)
                    # this request may be one of the good ones: probe when that chance pays for the
                    # draft's read of the context and the probe's waste, over what is left of it
                    remaining = self.model.expected_remaining(self.max_new_tokens, self._emitted)
                    if self.model.requests_differ() and (
                        self.model.probe_value(self._context, remaining, self.config.probe_k) > 0
                    ):
                        self.last_reason = "probe"
                        return min(self.config.probe_k, self.k_max)
                if self.model.take_probe_credit():
                    self.last_reason = "probe"
                    return min(self.config.probe_k, self.k_max)
            self.last_reason = reason
            return 0
        # never explore on a request's first drafting iteration: its draft time includes the draft's prefill
        alt = self.model.explore(k) if self._decided > 0 else None
        if alt is not None and alt <= self.k_max:
            self.last_reason = "explore"
            return alt
        self.last_reason = "best"
        return k

    def _redraw(self) -> tuple[int, float]:
        """A request that would not draft now by the means but has evidence of its own, where drafting
        pays for requests in general, draws its acceptance from its posterior (Thompson sampling):
        the ``k`` best for the drawn rate and its gain, when starting again pays for the draft's read
        of what it missed at that rate; else ``(0, 1.0)``. One draw per iteration (:meth:`gain` and
        :meth:`next_k` see the same). One rejection leaves the posterior wide, so a request stopped
        by bad luck resumes soon; one whose draft disagrees seldom does."""
        if self._drawn is None:
            self._drawn = (0, 1.0)
            if self._tested > 0 and self.model.estimate(0, 0).k_best > 0:
                est = self.model.estimate(self._accepted, self._tested, draw=True)
                k = min(est.k_best, self.k_max)
                if k > 0 and self._start_value(est, k) > 0:
                    self._drawn = (k, est.goodput[k] / est.goodput[0])
        return self._drawn

    def observe(self, outcome: IterationOutcome) -> None:
        steady = self._prev_k is not None and self._prev_k > 0
        catchup = outcome.context_len if outcome.k > 0 and self._draft_seen == 0 else 0
        self.model.observe(outcome, first=self._observed == 0, steady_draft=steady, catchup_tokens=catchup)
        self._drawn = None
        self._emitted += outcome.emitted
        self._context = outcome.context_len + outcome.emitted
        if outcome.k > 0:
            self._draft_seen = outcome.context_len + min(outcome.accepted, outcome.k - 1)
            self._accepted += outcome.accepted
            self._tested += outcome.tested
        elif outcome.draft_failed:  # a late draft restarts in a fresh session: resuming reads everything,
            self._draft_seen = 0  # so it is weighed as a resting request's is (_held)
            self._resting = True
        self._prev_k = outcome.k
        self._observed += 1

    def follow(self, outcome: IterationOutcome) -> None:
        """An iteration another drafter ran (``auto``): the request moved on; this drafter
        did not see it (its next draft reads what it missed, so its time is not a steady step)."""
        self._drawn = None
        self._emitted += outcome.emitted
        self._context = outcome.context_len + outcome.emitted
        self._prev_k = 0

    def gain(self) -> float:
        """What drafting the best ``k`` is expected to be worth now: its goodput over the target
        alone's, for this request's evidence; 1.0 when nothing pays or the request would not
        draft now (``wait``, ``not_worth_it``: :meth:`next_k` would answer 0); a resting request's
        redraw gains what the drawn rate says (:meth:`_redraw`)."""
        est = self.model.estimate(self._accepted, self._tested)
        k = min(est.k_best, self.k_max)
        if k == 0 or self._held(est, k) is not None:
            return self._redraw()[1]
        return est.goodput[k] / est.goodput[0]

    def finish(self) -> None:
        self.model.request_finished(self._accepted, self._tested, self._emitted)


class AutoDrafterController:
    """Per-request ``auto`` drafter choice: one :class:`GoodputController` per drafter, each over
    the shared :class:`GoodputModel` of its drafter (acceptance per position and cost measured for
    that drafter alone).

    Rule: before each iteration, the drafter whose controller expects the largest gain of its best
    ``k`` over the target alone (:meth:`GoodputController.gain`, from ``E[k] / T[k]``; none for a
    controller that would not draft now) drafts; on a tie the one listed first (the free drafter:
    a lookup costs nothing). Its controller then picks ``k`` as it would alone (0 when nothing
    pays). When nothing pays by the estimates, each drafter this request has not asked yet decides
    in turn, until one drafts: its first decision is where it may probe. The drafter that drafted
    an iteration learns from it; the others only follow the request; an iteration nobody drafted
    (the prefill, a lookup that found nothing) teaches all of them what a target step costs.
    """

    def __init__(self, controllers: dict[str, GoodputController]) -> None:
        assert controllers
        self.controllers = controllers
        self._current = next(iter(controllers))
        self._k: int | None = None  # the k _probe decided for the next iteration

    @property
    def last_reason(self) -> str:
        return f"{self._current}:{self.controllers[self._current].last_reason}"

    def next_drafter(self, names: Sequence[str]) -> str:
        offered = [n for n in names if n in self.controllers] or list(names[:1])
        gains = {n: self.controllers[n].gain() if n in self.controllers else 1.0 for n in offered}
        self._current = max(offered, key=lambda n: (gains[n], -offered.index(n)))
        self._k = None
        if gains[self._current] <= 1.0:
            self._probe(offered)
        return self._current

    def _probe(self, offered: Sequence[str]) -> None:
        """Nothing pays by the estimates: each drafter not yet asked in this request decides as it
        would alone (its first decision is where it probes), in order, until one drafts. Without
        this, a drafter whose estimates say nothing pays is never chosen, so never probes, and its
        estimates never change (seen: after a bad stretch ``auto`` never drafted with the model again)."""
        for name in offered:
            ctl = self.controllers.get(name)
            if ctl is not None and ctl.first_decision:
                self._current, self._k = name, ctl.next_k()
                if self._k > 0:
                    return

    def next_k(self) -> int:
        if self._k is not None:  # decided by _probe
            k, self._k = self._k, None
            return k
        ctl = self.controllers.get(self._current)
        return ctl.next_k() if ctl is not None else 0

    def observe(self, outcome: IterationOutcome) -> None:
        for name, ctl in self.controllers.items():
            if outcome.drafter in ("", name):
                ctl.observe(outcome)
            else:
                ctl.follow(outcome)

    def finish(self) -> None:
        for ctl in self.controllers.values():
            ctl.finish()
