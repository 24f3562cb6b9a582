"""``--profile N``: record N draft-verify iterations with ``torch.profiler``, write a Chrome trace.

The loop reports each finished iteration to its draft-length policy
(``policy.observe``); :meth:`IterationProfiler.wrap` hooks there, so the loop
itself knows nothing of profiling. Each iteration is one ``ProfilerStep#i``
span in the trace (open it in ``chrome://tracing`` or https://ui.perfetto.dev).
Use::

    with IterationProfiler(n, "trace.json") as prof:
        result = decoder.generate(request, prof.wrap(policy))
    # prof.iterations: how many were recorded (fewer if the request ended first)

Recording starts when the block is entered and stops after ``n`` iterations
(later ones run unprofiled) or at the end of the block, whichever comes first;
the trace is written then. One profiler records at a time in a process (a torch
limit): with concurrent requests, profile one of them.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from types import TracebackType
from typing import Any

from trtspec.decoding.protocols import DraftLengthPolicy
from trtspec.decoding.types import IterationOutcome


class IterationProfiler:
    """Profiles the first ``n`` loop iterations that go through :meth:`wrap`-ed policies."""

    def __init__(self, n: int, out: str | Path, record_shapes: bool = False) -> None:
        if n < 1:
            raise ValueError(f"--profile needs a number of iterations >= 1, got {n}")
        self.n = n
        self.out = Path(out)
        self.record_shapes = record_shapes
        self.iterations = 0
        self.written: Path | None = None
        self._prof: Any = None

    def __enter__(self) -> IterationProfiler:
        import torch
        from torch.profiler import ProfilerActivity, profile, schedule

        activities = [ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(ProfilerActivity.CUDA)
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*warmup.*")  # no warm-up wanted: the first iterations count
            self._prof = profile(
                activities=activities,
                record_shapes=self.record_shapes,
                schedule=schedule(wait=0, warmup=0, active=self.n, repeat=1),
                on_trace_ready=self._export,
            )
            self._prof.__enter__()
        return self

    def _export(self, prof: Any) -> None:
        self.out.parent.mkdir(parents=True, exist_ok=True)
        prof.export_chrome_trace(str(self.out))
        self.written = self.out

    def wrap(self, policy: DraftLengthPolicy) -> ProfiledPolicy:
        return ProfiledPolicy(policy, self)

    def step(self) -> None:
        """One iteration finished (each is a ``ProfilerStep#i`` span); stop and write the trace after the n-th."""
        if self._prof is None:
            return
        self.iterations += 1
        self._prof.step()
        if self.iterations >= self.n:
            self._finish()

    def _finish(self) -> None:
        prof, self._prof = self._prof, None
        if prof is None:
            return
        prof.__exit__(None, None, None)  # the schedule's trace-ready hook exports

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._finish()


class ProfiledPolicy:
    """A :class:`~trtspec.decoding.protocols.DraftLengthPolicy` that steps the profiler after each iteration."""

    def __init__(self, policy: DraftLengthPolicy, profiler: IterationProfiler) -> None:
        self.policy = policy
        self.profiler = profiler

    def next_k(self) -> int:
        return self.policy.next_k()

    def observe(self, outcome: IterationOutcome) -> None:
        self.policy.observe(outcome)
        self.profiler.step()
