"""Per-call deadlines for the draft, derived from the measured call times.

A draft is an optimisation: a proposal that comes later than the target
could have produced the tokens itself is worth nothing, and waiting for it
turns draft jitter into request latency. :class:`AdaptiveDeadline` keeps the
durations of the last ``window`` draft calls that made their deadline and
gives each new call::

    deadline = clamp(multiplier * p95(recent call times) * (1 + ahead), floor_s, max_s)
               + multiplier * read_rate * reads

where ``ahead`` is the number of draft calls still running when the call is
made: the draft model serves one call at a time, so a call queued behind
three others takes about four call times (measured: a step from 1 to 4
concurrent requests on the demo pair made every request's first draft call miss
a deadline fitted at concurrency 1, and the breaker opened on the lateness).
Measured durations are divided by the same ``1 + ahead`` (see ``GuardedModel``),
so the estimate stays the time of ONE call whatever the load.

``reads`` (:attr:`Work.reads`) are the tokens this call and the calls ahead
read rather than draft: a request's first proposal reads its whole prompt in
one pass, and a call may queue behind another request's. Without this term such
calls went late: on the demo pair (2 cores), ~400-token prompts sent beside two
streams of short requests missed the 0.6-0.8 s that four times the calls' p95
gave their first draft call on 4 of 6 requests, and each of those requests then
ran on the target alone to its end. ``read_rate`` is the median, over the last
``window`` calls that read at least ``READ_MIN_TOKENS`` with no call ahead,
of the time each took beyond a typical call (the median one) per token read;
until ``MIN_READ_SAMPLES`` such calls were measured, the calls' p95 per
``PRIOR_READ_TOKENS`` tokens (generous: a proposal of 5 takes about five draft
steps, and the demo pair's INT8 draft reads 64 tokens in four to six:
``scripts/bench_prompt_read.py``, 68-109 ms against 18 ms a step, 2 threads; the INT4
draft, the demo's default, in about ten: 105 ms against 10.7 ms, still within the prior).
The ceiling ``max_s`` bounds the calls' term only.

``max_s`` until ``min_samples`` calls were measured; a fixed deadline
(``fixed_s > 0``) ignores the measurements. Late calls are NOT measured: the
deadline stays anchored to the draft's healthy behaviour, so a draft that
turns slow keeps missing it (and the breaker learns of it) instead of the
deadline drifting up to whatever the draft now takes. Thread-safe.
"""

from __future__ import annotations

import math
import statistics
import threading
from collections import deque
from dataclasses import dataclass

READ_MIN_TOKENS = 32  # a call reading at least this many tokens measures the read rate
MIN_READ_SAMPLES = 3  # such calls measured before the read rate replaces its prior
PRIOR_READ_TOKENS = 16  # until then, a call's p95 reads this many tokens


@dataclass(frozen=True)
class Work:
    """What a call asks of its model, known when the call is made."""

    tokens: int  # new tokens the pass feeds (a proposal of k also counts its k drafted ones)
    calls_ahead: int = 0  # the model's calls still running (late ones abandoned included)
    tokens_ahead: int = 0  # their tokens: the model serves one call at a time, so it gets to this one after them
    drafted: int = 0  # of ``tokens``, those a proposal drafts (a model step each)
    drafted_ahead: int = 0  # of ``tokens_ahead``, those the calls ahead draft

    @property
    def reads(self) -> int:
        """Tokens this call reads in one pass (a prompt, a catch-up) rather than drafts."""
        return max(0, self.tokens - self.drafted)

    @property
    def reads_ahead(self) -> int:
        """Tokens the calls ahead read."""
        return max(0, self.tokens_ahead - self.drafted_ahead)


@dataclass(frozen=True)
class WorkDeadline:
    """How long a call may run before it counts as stuck: it grows with the work asked.

    ``base_s + per_token_s * (work.tokens + work.tokens_ahead)``. A fixed number
    cannot fit both a one-token decode step and a prefill of thousands of
    tokens queued behind another: measured on the demo pair (2 cores, fp32), a
    ~3,500-token prompt kept the target busy ~40 s and a ~6,700-token one
    missed a fixed 60 s deadline, for it and for the short request behind it.
    ``per_token_s`` is a worst-case rate (a slow CPU's prefill, with margin),
    not an estimate: this bound tells a stuck model from a busy one; latency is
    the admission controller's business.
    """

    base_s: float
    per_token_s: float

    def __post_init__(self) -> None:
        if self.base_s <= 0 or self.per_token_s < 0:
            raise ValueError(f"deadline: need base_s > 0 and per_token_s >= 0, got {self.base_s}, {self.per_token_s}")

    def __call__(self, work: Work) -> float:
        return self.base_s + self.per_token_s * (max(0, work.tokens) + max(0, work.tokens_ahead))


class AdaptiveDeadline:
    def __init__(
        self,
        *,
        fixed_s: float = 0.0,
        floor_s: float = 0.05,
        max_s: float = 2.0,
        multiplier: float = 4.0,
        window: int = 256,
        min_samples: int = 16,
    ) -> None:
        if fixed_s < 0 or floor_s < 0 or max_s <= 0 or floor_s > max_s:
            raise ValueError("deadline: need fixed_s >= 0 and 0 <= floor_s <= max_s, max_s > 0")
        if multiplier < 1 or window < 1 or min_samples < 1:
            raise ValueError("deadline: need multiplier >= 1, window >= 1, min_samples >= 1")
        self.fixed_s = fixed_s
        self.floor_s = floor_s
        self.max_s = max_s
        self.multiplier = multiplier
        self.min_samples = min_samples
        self._times: deque[float] = deque(maxlen=window)
        self._reads: deque[float] = deque(maxlen=window)  # seconds per token read, beyond a typical call
        self._lock = threading.Lock()
        self._p95: float | None = None
        self._dirty = False
        self._read_rate: float | None = None  # the median of ``_reads`` once there are enough
        self.on_time = 0  # calls measured
        self.late = 0  # calls that missed their deadline

    def observe(self, seconds: float, work: Work | None = None) -> None:
        """A call that made its deadline took ``seconds`` (its duration over ``1 + work.calls_ahead``);
        ``work``: what it asked (a call that read ``READ_MIN_TOKENS`` or more, with nothing ahead of
        it, also measures the read rate)."""
        if not math.isfinite(seconds) or seconds < 0:
            return
        reads = work.reads if work is not None and work.calls_ahead == 0 else 0
        with self._lock:
            if reads >= READ_MIN_TOKENS and len(self._times) >= self.min_samples:
                self._reads.append(max(0.0, seconds - statistics.median(self._times)) / reads)
                if len(self._reads) >= MIN_READ_SAMPLES:
                    self._read_rate = statistics.median(self._reads)
            self._times.append(seconds)
            self.on_time += 1
            self._dirty = True

    def observe_late(self) -> None:
        with self._lock:
            self.late += 1

    def p95_s(self) -> float | None:
        with self._lock:
            return self._p95_locked()

    def _p95_locked(self) -> float | None:
        if len(self._times) < self.min_samples:
            return None
        if self._dirty or self._p95 is None:
            ordered = sorted(self._times)
            self._p95 = ordered[min(len(ordered) - 1, math.ceil(0.95 * len(ordered)) - 1)]
            self._dirty = False
        return self._p95

    def deadline_s(self, work: Work = Work(tokens=0)) -> float:
        """The deadline for a call asking ``work`` (default: nothing to read, nothing ahead), in seconds."""
        if self.fixed_s > 0:
            return self.fixed_s
        with self._lock:
            p95 = self._p95_locked()
            rate = self._read_rate
        if p95 is None:
            return self.max_s
        calls = min(self.max_s, max(self.floor_s, self.multiplier * p95 * (1 + max(0, work.calls_ahead))))
        if rate is None:
            rate = p95 / PRIOR_READ_TOKENS
        return calls + self.multiplier * rate * (work.reads + work.reads_ahead)

    def snapshot(self) -> dict:
        return {
            "deadline_s": self.deadline_s(),
            "fixed": self.fixed_s > 0,
            "p95_s": self.p95_s(),
            "multiplier": self.multiplier,
            "read_s_per_token": self._read_rate,
            "on_time": self.on_time,
            "late": self.late,
        }
