"""Synthetic request logs and bench results whose plan figures are computed by hand in the tests."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trtspec.bench.records import RequestRecord
from trtspec.bench.runner import BenchResult
from trtspec.bench.stats import summarize

# (prompt_tokens, output_tokens, timestamp, priority); buckets (lo, hi]: 0-32, 33-64, 65-128, 257-512, 33-64
ROWS = [
    (10, 100, 0, "normal"),
    (50, 200, 10, "high"),
    (100, 100, 20, "normal"),
    (300, 400, 30, "low"),
    (40, 200, 40, "normal"),
]


@pytest.fixture
def small_log(tmp_path: Path) -> Path:
    p = tmp_path / "requests.jsonl"
    p.write_text("".join(
        json.dumps({"prompt_tokens": a, "output_tokens": b, "timestamp": 1_700_000_000 + t, "priority": pr}) + "\n"
        for a, b, t, pr in ROWS
    ))
    return p


def _record(i: int, arm: str, input_tokens: int, drafted: int, accepted: int, chunks: int, interval_s: float,
            tokens: int) -> RequestRecord:
    times = [0.05 + j * interval_s for j in range(chunks)]
    return RequestRecord(i, arm, tokens, arrival_s=float(i), sent_s=float(i), done_s=float(i) + times[-1] + 0.001,
                         chunks=[(t, 4) for t in times], input_tokens=input_tokens, output_tokens=tokens,
                         drafted=drafted, accepted=accepted, finish_reason="length")


def bench_result(rate: float, speedup: float, drafter: str | None = None, drafted: int = 100,
                 accepted: tuple[int, int] = (60, 90)) -> BenchResult:
    # (figures with the defaults) auto: 26 chunks each (the prefill's token, then 25 drafting iterations),
    # 100 drafted per request -> k = 100 / 25 = 4; one iteration every 30 ms
    # off: one token per chunk every 10 ms -> c = (30 / 10 - 1) / 4 = 0.5
    records = [
        _record(0, "auto", 40, drafted, accepted[0], 26, 0.030, 85),   # bucket 33-64: 60 / 100
        _record(1, "auto", 100, drafted, accepted[1], 26, 0.030, 115),  # bucket 65-128: 90 / 100
        _record(2, "off", 40, 0, 0, 50, 0.010, 50),
        _record(3, "off", 100, 0, 0, 50, 0.010, 50),
    ]
    summary = summarize(records, arms=("auto", "off"))
    summary["speedup_vs_off"]["auto"] = speedup  # the measured figure the load correction reads
    config = {"rate_rps": rate, "mode": "open"} | ({"drafter": drafter} if drafter else {})  # none: an older file
    return BenchResult(config=config, started_at="", records=records, summary=summary, client={})


@pytest.fixture
def make_bench():
    """:func:`bench_result`: a synthetic bench run (``drafter``: its ``--drafter``; None: an older results file)."""
    return bench_result
