"""Static shapes for the lean runtime: how a pass is laid out, and one replayable step per shape.

A pass of ``n`` new tokens becomes one or more passes of ``R`` rows (padded
with dummy rows) attending over a window of ``W`` cache slots (a mask hides
the slots after each row's position). ``(R, W)`` come from small sets of
buckets, so a given shape is always the same computation:

- on CUDA it can be captured once as a CUDA graph and replayed;
- in **exact mode** every pass has the same ``R``, so the logits of a position
  do not depend on how many tokens its pass carried (a decode step, a verify of
  any ``k``, a prefill chunk): greedy speculative output equals the target
  alone bit for bit in bf16/fp16. Without it, a 1-row and a 6-row pass differ
  in the last bits and near-ties flip (docs/runtime.md, "Exact mode").

Windows: powers of two from :attr:`ShapePlan.min_window`, capped at the
cache's largest size. A masked slot adds exactly zero to the softmax, so a row
gives the same bits whichever window bucket its pass used.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

Step = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # (ids [R], pos [R]) -> logits [R, vocab]
Capture = Callable[[Step, int, int], Step]  # (eager step, rows, window) -> a step that replays a capture

EXACT_ROWS = 8  # exact mode's rows per pass: a verify of k <= 7 drafts in one pass
GRAPH_ROWS = (1, 8, 16)  # rows buckets of graphed passes (decode; verify k <= 7; k <= 15)


@dataclass(frozen=True)
class ShapePlan:
    """How passes are shaped. ``exact_rows``: every pass has exactly that many rows.
    Otherwise ``rows_buckets`` (graphs): rows padded to the smallest bucket that fits,
    a pass longer than all buckets runs unpadded. Neither: unpadded passes over
    exactly the cached keys (eager CPU decoding, no waste)."""

    exact_rows: int | None = None
    rows_buckets: tuple[int, ...] = ()
    min_window: int = 256

    def __post_init__(self) -> None:
        if self.exact_rows is not None and self.exact_rows < 1:
            raise ValueError(f"exact_rows must be >= 1, got {self.exact_rows}")
        if list(self.rows_buckets) != sorted(set(self.rows_buckets)) or any(r < 1 for r in self.rows_buckets):
            raise ValueError(f"rows buckets must be increasing positive integers, got {self.rows_buckets}")

    @property
    def static(self) -> bool:
        """Whether passes are padded and windowed (else dynamic: ``R = n``, ``W = end``)."""
        return self.exact_rows is not None or bool(self.rows_buckets)

    @property
    def max_rows(self) -> int:
        return self.exact_rows or (self.rows_buckets[-1] if self.rows_buckets else 0)

    def chunks(self, n: int) -> list[int]:
        """Real rows of each pass that ``n`` new tokens take."""
        assert n > 0
        if self.exact_rows is None:
            return [n]
        r = self.exact_rows
        return [r] * (n // r) + ([n % r] if n % r else [])

    def rows(self, n: int) -> int | None:
        """Rows of the pass that carries ``n`` real rows; ``None``: unpadded (no static shape)."""
        if self.exact_rows is not None:
            assert n <= self.exact_rows
            return self.exact_rows
        return next((r for r in self.rows_buckets if r >= n), None)

    def window(self, needed: int, limit: int) -> int:
        """Slots a pass whose rows end at slot ``needed`` attends over: a power of two, at most ``limit``."""
        assert needed <= limit, f"{needed} slots needed, the cache holds {limit}"
        w = self.min_window
        while w < needed:
            w *= 2
        return min(w, limit)


@dataclass
class GraphStats:
    """What capturing cost, reported at load and by benchmarks."""

    graphs: int = 0
    capture_s: float = 0.0
    memory_bytes: int = 0
    keys: list[tuple[int, int]] = field(default_factory=list)  # (rows, window) in capture order

    def to_dict(self) -> dict:
        return {
            "graphs": self.graphs,
            "capture_s": round(self.capture_s, 3),
            "memory_bytes": self.memory_bytes,
            "shapes": [list(k) for k in self.keys],
        }


class GraphCache:
    """One replayable step per ``(rows, window)``, made by ``capture`` on first use, replayed after.

    ``step_for(rows, window)`` gives the eager step of that shape (it reads and
    writes the model's resident KV cache); ``capture`` turns it into a replayable
    one (on CUDA: a CUDA graph over compiled layers; tests pass a recorder).
    ``memory`` reads the device memory in use, to report what captures took.
    """

    def __init__(
        self,
        step_for: Callable[[int, int], Step],
        capture: Capture,
        memory: Callable[[], int] = lambda: 0,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self._step_for = step_for
        self._capture = capture
        self._memory = memory
        self._clock = clock
        self._steps: dict[tuple[int, int], Step] = {}
        self.stats = GraphStats()

    def __contains__(self, key: tuple[int, int]) -> bool:
        return key in self._steps

    def get(self, rows: int, window: int) -> Step:
        key = (rows, window)
        step = self._steps.get(key)
        if step is None:
            m0, t0 = self._memory(), self._clock()
            step = self._capture(self._step_for(rows, window), rows, window)
            self.stats.capture_s += self._clock() - t0
            self.stats.memory_bytes += self._memory() - m0
            self.stats.graphs += 1
            self.stats.keys.append(key)
            self._steps[key] = step
        return step

    def run(self, ids: torch.Tensor, pos: torch.Tensor, window: int) -> torch.Tensor:
        return self.get(int(ids.shape[0]), window)(ids, pos)
