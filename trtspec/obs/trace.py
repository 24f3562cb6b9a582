"""Rejection traces: a sampled, size-bounded, rotated JSONL file of rejection events, and its summary.

A **rejection event** is a draft (an iteration with ``k > 0``) in which at least
one drafted token was rejected. Each sampled event is one JSON line::

    {"v": 1, "request_id": "r-17", "time": 1733150000.123, "seq_len": 87, "k": 5, "accepted": 2,
     "first_rejected": 3,                      # 1-based draft position of the first rejected token
     "draft_tokens": [318, 257, 1049, 12, 9],  # all k drafted tokens
     "target_tokens": [318, 257, 2061, ...],   # the target's tokens at those positions (see below)
     "draft_text": ["the", " a", " big", ...], "target_text": [...]}   # per token, with a detokenizer

``target_tokens[i]`` is the target's token at draft position ``i + 1`` given the
drafted tokens before it: with greedy decoding its argmax at every position
(``k`` tokens); with sampling only up to the first rejected position, where it
is the correction token the target drew (``first_rejected`` tokens).

Sampling: each event is written with probability ``sample_rate`` (a seeded RNG
makes tests exact). Size: when the file would pass ``max_bytes`` it is rotated
(``FILE`` -> ``FILE.1`` -> ... -> ``FILE.<backups>``, the oldest dropped), so the
trace never holds more than ``(backups + 1) * max_bytes``.

:func:`summarize` reads one or more trace files and gives what the weekly
analysis looks at: rejections by first rejected position, by sequence-length
bucket, by hour of day (UTC), and the most-rejected draft tokens with what the
target wanted instead.
"""

from __future__ import annotations

import json
import os
import random
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING

from trtspec.obs.metrics import BUCKET_LABELS, length_bucket

if TYPE_CHECKING:  # importing trtspec.decoding loads torch; `trtspec trace summarize` needs neither
    from trtspec.decoding.protocols import Detokenizer
    from trtspec.decoding.types import IterationOutcome

TRACE_VERSION = 1


class RejectionTracer:
    """Writes sampled rejection events to ``path`` (JSONL). Safe to call from any thread."""

    def __init__(
        self,
        path: str | Path,
        sample_rate: float = 0.01,
        max_bytes: int = 16 * 1024 * 1024,
        backups: int = 3,
        detokenizer: Detokenizer | None = None,
        seed: int | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if not 0.0 <= sample_rate <= 1.0:
            raise ValueError(f"trace sample rate must be in [0, 1], got {sample_rate}")
        if max_bytes < 1024:
            raise ValueError(f"trace max_bytes must be at least 1024, got {max_bytes}")
        if backups < 0:
            raise ValueError(f"trace backups must be >= 0, got {backups}")
        self.path = Path(path)
        self.sample_rate = sample_rate
        self.max_bytes = max_bytes
        self.backups = backups
        self.detokenizer = detokenizer
        self._rng = random.Random(seed)
        self._clock = clock
        self._lock = threading.Lock()
        self.offered = 0  # rejection events seen
        self.written = 0  # ... of which sampled and written
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def record(
        self,
        request_id: str,
        outcome: IterationOutcome,
        drafted: Sequence[int],
        target_tokens: Sequence[int],
        seq_len: int | None = None,
    ) -> bool:
        """Offer one iteration; True when it was a rejection event and was sampled and written."""
        k, acc = outcome.k, outcome.accepted
        if k == 0 or acc >= k:
            return False  # not a rejection event
        assert len(drafted) == k, f"drafted has {len(drafted)} tokens, k is {k}"
        assert acc + 1 <= len(target_tokens) <= k, f"{len(target_tokens)} target tokens for k={k}, accepted={acc}"
        with self._lock:
            self.offered += 1
            if self._rng.random() >= self.sample_rate:
                return False
        event = {
            "v": TRACE_VERSION,
            "request_id": request_id,
            "time": round(self._clock(), 3),
            "seq_len": outcome.context_len if seq_len is None else seq_len,
            "k": k,
            "accepted": acc,
            "first_rejected": acc + 1,
            "draft_tokens": [int(t) for t in drafted],
            "target_tokens": [int(t) for t in target_tokens],
        }
        if self.detokenizer is not None:
            event["draft_text"] = [self.detokenizer.decode([int(t)]) for t in drafted]
            event["target_text"] = [self.detokenizer.decode([int(t)]) for t in target_tokens]
        line = (json.dumps(event, ensure_ascii=False) + "\n").encode("utf-8")
        with self._lock:
            self._rotate_if_needed(len(line))
            with self.path.open("ab") as f:
                f.write(line)
            self.written += 1
        return True

    def _rotate_if_needed(self, incoming: int) -> None:
        try:
            size = self.path.stat().st_size
        except FileNotFoundError:
            return
        if size == 0 or size + incoming <= self.max_bytes:
            return
        if self.backups == 0:
            self.path.unlink()
            return
        oldest = self.rotated(self.backups)
        if oldest.exists():
            oldest.unlink()
        for i in range(self.backups - 1, 0, -1):
            src = self.rotated(i)
            if src.exists():
                os.replace(src, self.rotated(i + 1))
        os.replace(self.path, self.rotated(1))

    def rotated(self, i: int) -> Path:
        """The ``i``-th rotated file (``FILE.1`` is the most recent)."""
        return self.path.with_name(f"{self.path.name}.{i}")

    def files(self) -> list[Path]:
        """The trace's files that exist, oldest first."""
        out = [self.rotated(i) for i in range(self.backups, 0, -1)]
        return [p for p in [*out, self.path] if p.exists()]


# -- summary ------------------------------------------------------------------------


@dataclass
class TraceSummary:
    events: int = 0
    bad_lines: int = 0
    first_time: float | None = None
    last_time: float | None = None
    mean_k: float | None = None
    mean_accepted: float | None = None
    by_position: dict[int, int] = field(default_factory=dict)  # first rejected position (1-based) -> events
    by_bucket: dict[str, int] = field(default_factory=dict)  # sequence-length bucket -> events
    by_hour: dict[int, int] = field(default_factory=dict)  # hour of day, UTC -> events
    top_tokens: list[dict] = field(default_factory=list)  # most-rejected draft tokens

    def to_dict(self) -> dict:
        return {
            "events": self.events,
            "bad_lines": self.bad_lines,
            "first_time": _iso(self.first_time),
            "last_time": _iso(self.last_time),
            "mean_k": self.mean_k,
            "mean_accepted": self.mean_accepted,
            "by_position": {str(k): v for k, v in sorted(self.by_position.items())},
            "by_bucket": dict(self.by_bucket),
            "by_hour_utc": {f"{h:02d}": v for h, v in sorted(self.by_hour.items())},
            "top_rejected_tokens": self.top_tokens,
        }


def _iso(t: float | None) -> str | None:
    return None if t is None else datetime.fromtimestamp(t, timezone.utc).isoformat(timespec="seconds")


def read_events(paths: Iterable[str | Path]) -> tuple[list[dict], int]:
    """Every well-formed event of ``paths`` (in order) and the number of lines that were not."""
    events: list[dict] = []
    bad = 0
    for path in paths:
        with Path(path).open(encoding="utf-8") as f:
            for line in f:
                if not line.strip():
                    continue
                try:
                    e = json.loads(line)
                    k, first = int(e["k"]), int(e["first_rejected"])
                    float(e["time"]), int(e["seq_len"])
                    if not (1 <= first <= k and len(e["draft_tokens"]) == k):
                        raise ValueError("inconsistent event")
                except (ValueError, KeyError, TypeError):
                    bad += 1
                    continue
                events.append(e)
    return events, bad


def summarize(paths: Iterable[str | Path], top: int = 10) -> TraceSummary:
    """The patterns in rejection traces; see the module docstring."""
    events, bad = read_events(paths)
    out = TraceSummary(events=len(events), bad_lines=bad)
    if not events:
        return out
    times = [float(e["time"]) for e in events]
    out.first_time, out.last_time = min(times), max(times)
    out.mean_k = sum(int(e["k"]) for e in events) / len(events)
    out.mean_accepted = sum(int(e["accepted"]) for e in events) / len(events)
    out.by_position = dict(Counter(int(e["first_rejected"]) for e in events))
    buckets = Counter(length_bucket(int(e["seq_len"])) for e in events)
    out.by_bucket = {b: buckets[b] for b in BUCKET_LABELS if buckets[b]}
    out.by_hour = dict(Counter(datetime.fromtimestamp(t, timezone.utc).hour for t in times))
    rejected: Counter[int] = Counter()
    wanted: dict[int, Counter[int]] = defaultdict(Counter)
    text: dict[int, str] = {}
    for e in events:
        i = int(e["first_rejected"]) - 1
        tok = int(e["draft_tokens"][i])
        rejected[tok] += 1
        if i < len(e.get("target_tokens", ())):
            t = int(e["target_tokens"][i])
            wanted[tok][t] += 1
            if "target_text" in e and i < len(e["target_text"]):
                text.setdefault(t, e["target_text"][i])
        if "draft_text" in e and i < len(e["draft_text"]):
            text.setdefault(tok, e["draft_text"][i])
    for tok, n in rejected.most_common(top):
        instead = wanted[tok].most_common(1)
        out.top_tokens.append(
            {
                "token": tok,
                "text": text.get(tok),
                "rejections": n,
                "target_instead": instead[0][0] if instead else None,
                "target_instead_text": text.get(instead[0][0]) if instead else None,
            }
        )
    return out


def format_summary(s: TraceSummary) -> str:
    """The summary as the plain-text report ``trtspec trace summarize`` prints."""
    if s.events == 0:
        return f"no rejection events ({s.bad_lines} malformed lines)\n" if s.bad_lines else "no rejection events\n"
    lines = [
        f"{s.events} rejection events from {_iso(s.first_time)} to {_iso(s.last_time)}"
        + (f" ({s.bad_lines} malformed lines skipped)" if s.bad_lines else ""),
        f"mean k {s.mean_k:.2f}, mean accepted before the rejection {s.mean_accepted:.2f}",
        "",
        "first rejected position:",
    ]
    lines += _bars({f"  {p:>4}": n for p, n in sorted(s.by_position.items())}, s.events)
    lines += ["", "sequence length (tokens):"]
    lines += _bars({f"  {b:>8}": n for b, n in s.by_bucket.items()}, s.events)
    lines += ["", "hour of day (UTC):"]
    lines += _bars({f"  {h:02d}:00": n for h, n in sorted(s.by_hour.items())}, s.events)
    lines += ["", "most-rejected draft tokens (what the target wanted instead):"]
    for t in s.top_tokens:
        shown = repr(t["text"]) if t["text"] is not None else ""
        instead = t["target_instead_text"] if t["target_instead_text"] is not None else t["target_instead"]
        instead_shown = repr(instead) if isinstance(instead, str) else str(instead)
        lines.append(f"  {t['rejections']:>6}  {t['token']:>7} {shown:<16} -> {instead_shown}")
    return "\n".join(lines) + "\n"


def _bars(counts: dict[str, int], total: int, width: int = 30) -> list[str]:
    return [f"{label}  {n:>6}  {n / total:6.1%}  {'#' * round(width * n / total)}" for label, n in counts.items()]
