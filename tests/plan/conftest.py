"""Synthetic request logs and bench results whose plan figures are computed by hand in the tests."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

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
