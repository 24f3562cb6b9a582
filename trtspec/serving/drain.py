"""Draining: how ``trtspec serve`` shuts down without losing a request.

On SIGTERM (Kubernetes, a load balancer) or SIGINT, the launcher writes
``<TRTSPEC_STATUS_DIR>/drain.json`` (:func:`start_drain`). From then on:

- readiness is false (the status endpoint's ``/ready`` answers 503), so
  nothing new is routed here;
- ``spec_decode`` refuses every new request with ``UNAVAILABLE`` ("the server
  is shutting down"), counted as outcome ``draining``;
- requests in flight run to completion until ``grace_ends_at``; past it they
  end at their next loop iteration with ``UNAVAILABLE`` and a one-line reason,
  counted as outcome ``shutdown``.

The launcher waits for ``spec_decode``'s status file to report no request in
flight (:meth:`trtspec.serving.launcher.TritonServer.drain`), then stops
``tritonserver``. :func:`end_grace` cuts the grace short (a second signal).
The models read the file through :class:`DrainWatch`, at most every 0.1 s.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

from trtspec.serving import statusfile

DRAIN_FILE = "drain.json"


def start_drain(status_dir: Path, grace_period_s: float) -> None:
    """Tell the models that the server drains: new requests refused, in-flight ones end by the grace."""
    now = time.time()
    statusfile.write_status(status_dir / DRAIN_FILE, {
        "started_at": now, "grace_period_s": grace_period_s, "grace_ends_at": now + grace_period_s,
    })


def end_grace(status_dir: Path) -> None:
    """The grace period is over now: requests still in flight end at their next iteration."""
    data = statusfile.read_status(status_dir / DRAIN_FILE) or {"started_at": time.time(), "grace_period_s": 0.0}
    statusfile.write_status(status_dir / DRAIN_FILE, {
        "started_at": data.get("started_at"), "grace_period_s": data.get("grace_period_s"),
        "grace_ends_at": time.time(),
    })


def read_drain(status_dir: Path | None) -> dict | None:
    """The drain file (``started_at``, ``grace_period_s``, ``grace_ends_at``, Unix times), None when not draining."""
    return statusfile.read_status(status_dir / DRAIN_FILE) if status_dir is not None else None


class DrainWatch:
    """Whether the server drains (the file is read at every ask: once per new request), and whether its
    grace period is over (read at most every ``interval_s``: asked every loop iteration). ``on_start`` runs
    once, when the drain
    is first seen (``spec_decode`` writes its status then, so the launcher sees what was in flight).
    Thread-safe."""

    def __init__(self, status_dir: Path | None, interval_s: float = 0.1,
                 on_start: Callable[[], None] | None = None) -> None:
        self._dir = status_dir
        self._interval_s = interval_s
        self._on_start = on_start
        self._lock = threading.Lock()
        self._checked = -float("inf")
        self._grace_ends_at: float | None = None
        self._grace_period_s = 0.0

    def _grace_end(self, fresh: bool = False) -> float | None:
        if self._dir is None:
            return None
        now = time.monotonic()
        started = False
        with self._lock:
            if fresh or now - self._checked >= self._interval_s:
                self._checked = now
                data = read_drain(self._dir)
                end = data.get("grace_ends_at") if data else None
                started = self._grace_ends_at is None and isinstance(end, (int, float))
                self._grace_ends_at = float(end) if isinstance(end, (int, float)) else None
                period = data.get("grace_period_s") if data else None
                self._grace_period_s = float(period) if isinstance(period, (int, float)) else 0.0
            end_at = self._grace_ends_at
        if started and self._on_start is not None:
            self._on_start()
        return end_at

    def draining(self) -> bool:
        return self._grace_end(fresh=True) is not None

    def past_grace(self) -> bool:
        end = self._grace_end()
        return end is not None and time.time() >= end

    def grace_period_s(self) -> float:
        self._grace_end()
        return self._grace_period_s
