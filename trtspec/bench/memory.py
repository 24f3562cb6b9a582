"""The server's memory over a run, and its counters before and after: scraped from Triton's metrics port
and, for a local server, read from ``/proc``.

What the metrics port has (Triton 2.51, the CPU build here; checked):

- ``nv_cpu_memory_used_bytes`` / ``nv_cpu_memory_total_bytes``: the HOST's RAM
  (from ``/proc/meminfo``, refreshed every ``--metrics-interval-ms``, 2 s by
  default; 0 until the first refresh), not the server's own. Kept as a
  context series.
- ``nv_gpu_memory_used_bytes{gpu_uuid=...}``: per GPU, on GPU builds only;
  summed here.
- ``trtspec_model_memory_bytes{role=draft|target}``: the runtimes' own figure,
  when the serving models export it (:mod:`trtspec.obs.metrics`).
- ``trtspec_*`` counters (requests by outcome, drafted/accepted tokens, by draft
  position when exported, fallbacks, route decisions): read at the start and
  the end; the report uses their increase over the run. The server counts a
  request right after sending its final response, so the closing read waits
  (up to ``SETTLE_S``) until it has counted every request the client saw answered.

A local server's processes: the ``tritonserver`` and its children (each Python
backend stub is a separate process, a child of the server), found by walking
``/proc``. For each sample: the sum of their ``VmRSS`` (what ``top`` shows;
counts shared library pages once per process) and the sum of their ``Pss``
from ``smaps_rollup`` (shared pages split between the processes that map
them: the honest total).
"""

from __future__ import annotations

import math
import re
import time
import urllib.error
import urllib.request
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')

Labels = tuple[tuple[str, str], ...]


def parse_prometheus(text: str) -> dict[str, dict[Labels, float]]:
    """Prometheus text exposition -> ``{name: {sorted label pairs: value}}`` (comments skipped)."""
    out: dict[str, dict[Labels, float]] = defaultdict(dict)
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if not m:
            continue
        name, _, labels, value = m.groups()
        try:
            v = float(value)
        except ValueError:
            continue
        pairs = tuple(sorted(_LABEL.findall(labels or "")))
        out[name][pairs] = v
    return dict(out)


def scrape(url: str, timeout_s: float = 2.0) -> dict[str, dict[Labels, float]]:
    """One scrape of a metrics endpoint; raises ``OSError`` when it cannot be read."""
    with urllib.request.urlopen(url, timeout=timeout_s) as r:
        return parse_prometheus(r.read().decode("utf-8", errors="replace"))


def total(metrics: dict[str, dict[Labels, float]], name: str, **match: str) -> float | None:
    """Sum of a family's series whose labels include ``match``; None when the family is absent."""
    series = metrics.get(name)
    if series is None:
        return None
    return sum(v for labels, v in series.items() if all((k, val) in labels for k, val in match.items()))


def counter_deltas(before: dict, after: dict, prefix: str = "trtspec_") -> dict[str, dict[str, float]]:
    """Increase of every ``prefix*`` counter series between two scrapes: ``{name: {label text: delta}}``.
    A series missing before counts from 0 (it appears at its first increment)."""
    out: dict[str, dict[str, float]] = {}
    for name, series in after.items():
        if not name.startswith(prefix) or not name.endswith("_total"):
            continue
        old = before.get(name, {})
        deltas = {}
        for labels, v in series.items():
            text = ",".join(f"{k}={val}" for k, val in labels if k != "model") or "all"
            deltas[text] = deltas.get(text, 0.0) + (v - old.get(labels, 0.0))
        out[name] = deltas
    return out


# -- /proc -------------------------------------------------------------------------------------


def process_tree(pid: int) -> list[int]:
    """``pid`` and every descendant, from ``/proc/*/stat`` (Linux); empty when ``pid`` is gone."""
    from trtspec.serving.stubs import descendants

    if not Path(f"/proc/{pid}").exists():
        return []
    return [pid, *descendants(pid)]


def _kb_field(path: str, key: str) -> int | None:
    try:
        with open(path) as f:
            for line in f:
                if line.startswith(key):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def process_memory(pid: int) -> tuple[int, int | None, int] | None:
    """(sum of VmRSS, sum of Pss or None where unreadable, process count) over ``pid``'s tree; None if gone."""
    pids = process_tree(pid)
    if not pids:
        return None
    rss = 0
    pss: int | None = 0
    for p in pids:
        rss += _kb_field(f"/proc/{p}/status", "VmRSS:") or 0
        v = _kb_field(f"/proc/{p}/smaps_rollup", "Pss:")
        pss = None if v is None or pss is None else pss + v
    return rss, pss, len(pids)


# -- the samples ---------------------------------------------------------------------------------


@dataclass
class MemorySample:
    t_s: float  # seconds from the run's start
    host_used_bytes: float | None = None  # nv_cpu_memory_used_bytes (the whole host)
    gpu_used_bytes: float | None = None  # sum of nv_gpu_memory_used_bytes
    model_bytes: dict[str, float] = field(default_factory=dict)  # trtspec_model_memory_bytes by role
    rss_bytes: int | None = None  # sum of VmRSS over the server's processes (local server)
    pss_bytes: int | None = None  # sum of Pss over the same
    processes: int | None = None

    def to_dict(self) -> dict:
        return {k: v for k, v in self.__dict__.items()}


def sample(t_s: float, metrics: dict | None, pid: int | None) -> MemorySample:
    s = MemorySample(t_s)
    if metrics is not None:
        host = total(metrics, "nv_cpu_memory_used_bytes")
        s.host_used_bytes = host if host else None  # 0 until Triton's first refresh
        s.gpu_used_bytes = total(metrics, "nv_gpu_memory_used_bytes")
        for labels, v in metrics.get("trtspec_model_memory_bytes", {}).items():
            role = dict(labels).get("role", "model")
            s.model_bytes[role] = s.model_bytes.get(role, 0.0) + v
    if pid is not None:
        pm = process_memory(pid)
        if pm is not None:
            s.rss_bytes, s.pss_bytes, s.processes = pm
    return s


SERIES = ("pss_bytes", "rss_bytes", "gpu_used_bytes", "host_used_bytes")


def series(samples: list[MemorySample], name: str) -> tuple[list[float], list[float]]:
    """(times, values) of one series, the samples that have it."""
    pts = [(s.t_s, float(getattr(s, name))) for s in samples if getattr(s, name) is not None]
    return [t for t, _ in pts], [v for _, v in pts]


def summarize_memory(samples: list[MemorySample]) -> dict:
    """Per series: first, last, peak, growth (last - first) and the least-squares slope in bytes/minute."""
    out: dict = {"samples": len(samples)}
    names = list(SERIES) + [f"model:{r}" for r in sorted({r for s in samples for r in s.model_bytes})]
    for name in names:
        if name.startswith("model:"):
            role = name.split(":", 1)[1]
            pts = [(s.t_s, s.model_bytes[role]) for s in samples if role in s.model_bytes]
            ts, vs = [t for t, _ in pts], [v for _, v in pts]
        else:
            ts, vs = series(samples, name)
        if not vs:
            continue
        out[name] = {
            "first": vs[0],
            "last": vs[-1],
            "peak": max(vs),
            "growth": vs[-1] - vs[0],
            "slope_bytes_per_min": _slope(ts, vs) * 60.0,
        }
    return out


def _slope(ts: list[float], vs: list[float]) -> float:
    n = len(ts)
    if n < 2:
        return 0.0
    mt, mv = sum(ts) / n, sum(vs) / n
    den = sum((t - mt) ** 2 for t in ts)
    if den == 0 or math.isnan(den):
        return 0.0
    return sum((t - mt) * (v - mv) for t, v in zip(ts, vs, strict=True)) / den


SETTLE_S = 2.0  # longest wait for the server to count the last answered requests


def scrape_settled(url: str | None, before: dict | None, answered: int) -> dict | None:
    """The closing scrape, once ``trtspec_requests_total`` has grown by ``answered`` since ``before``
    (or ``SETTLE_S`` passed; at once from a server that has no such counter): the counters then
    cover every request the client saw answered."""
    give_up, name = time.monotonic() + SETTLE_S, "trtspec_requests_total"
    while True:
        after = try_scrape(url)
        if after is None or before is None or time.monotonic() >= give_up:
            return after
        if name not in before and name not in after:  # not a trtspec server: nothing to wait for
            return after
        if sum(counter_deltas(before, after).get(name, {}).values()) >= answered:
            return after
        time.sleep(0.05)


def try_scrape(url: str | None) -> dict | None:
    if not url:
        return None
    try:
        return scrape(url)
    except (OSError, urllib.error.URLError, ValueError):
        return None
