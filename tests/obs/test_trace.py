"""Rejection traces: sampling, size-bounded rotation, and the summary of a known trace (library and CLI)."""

from __future__ import annotations

import json
import random
from datetime import datetime, timezone
from pathlib import Path

import pytest
from typer.testing import CliRunner

from trtspec.cli.trace import app
from trtspec.obs import metrics as M
from trtspec.obs.recorder import SpecMetrics
from trtspec.obs.sinks import PrometheusClientSink
from trtspec.obs.trace import RejectionTracer, read_events, summarize
from trtspec.decoding.types import IterationOutcome

runner = CliRunner()
T0 = datetime(2025, 3, 3, 9, 15, tzinfo=timezone.utc).timestamp()  # a Monday, 09:15 UTC


def _outcome(k: int, accepted: int, context_len: int = 40) -> IterationOutcome:
    return IterationOutcome(k, accepted, accepted + 1, accepted == k, context_len, 0.01, 0.02)


class _Words:
    """A detokenizer: token t is the word 'w<t>'."""

    def decode(self, token_ids) -> str:  # type: ignore[no-untyped-def]
        return "".join(f"w{t}" for t in token_ids)


def test_only_rejections_are_offered_and_sampling_follows_the_seed(tmp_path: Path) -> None:
    tracer = RejectionTracer(tmp_path / "r.jsonl", sample_rate=0.3, seed=7)
    assert not tracer.record("a", _outcome(4, 4), [1, 2, 3, 4], [1, 2, 3, 4])  # fully accepted: no event
    assert not tracer.record("a", _outcome(0, 0), [], [])  # plain target step
    assert tracer.offered == 0
    written = [tracer.record("a", _outcome(4, 1), [1, 2, 3, 4], [1, 9, 3, 4]) for _ in range(200)]
    rng = random.Random(7)
    assert written == [rng.random() < 0.3 for _ in range(200)]
    assert tracer.offered == 200 and tracer.written == sum(written)
    assert 30 < sum(written) < 90
    events, bad = read_events([tracer.path])
    assert len(events) == sum(written) and bad == 0


def test_event_fields(tmp_path: Path) -> None:
    clock = lambda: T0  # noqa: E731
    tracer = RejectionTracer(tmp_path / "r.jsonl", sample_rate=1.0, detokenizer=_Words(), clock=clock)
    # sampling: target tokens known up to the first rejected position (the correction token)
    assert tracer.record("req-1", _outcome(5, 2, context_len=70), [11, 12, 13, 14, 15], [11, 12, 99])
    (event,) = [json.loads(line) for line in tracer.path.read_text().splitlines()]
    assert event == {
        "v": 1,
        "request_id": "req-1",
        "time": T0,
        "seq_len": 70,
        "k": 5,
        "accepted": 2,
        "first_rejected": 3,
        "draft_tokens": [11, 12, 13, 14, 15],
        "target_tokens": [11, 12, 99],
        "draft_text": ["w11", "w12", "w13", "w14", "w15"],
        "target_text": ["w11", "w12", "w99"],
    }


def test_rotation_bounds_the_size(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    tracer = RejectionTracer(path, sample_rate=1.0, max_bytes=1024, backups=2)
    for i in range(100):
        tracer.record(f"req-{i}", _outcome(4, 0), [1, 2, 3, 4], [5, 6, 7, 8])
    assert tracer.written == 100
    assert [p.name for p in tracer.files()] == ["r.jsonl.2", "r.jsonl.1", "r.jsonl"]
    assert not tracer.rotated(3).exists()
    for p in tracer.files():
        assert 0 < p.stat().st_size <= 1024
    events, _ = read_events(tracer.files())
    ids = [int(e["request_id"].split("-")[1]) for e in events]
    assert ids == list(range(100 - len(ids), 100))  # the newest, in order, none lost between the kept files
    assert len(ids) < 100


def test_no_backups_keeps_one_file(tmp_path: Path) -> None:
    tracer = RejectionTracer(tmp_path / "r.jsonl", sample_rate=1.0, max_bytes=1024, backups=0)
    for i in range(50):
        tracer.record(f"req-{i}", _outcome(4, 0), [1, 2, 3, 4], [5, 6, 7, 8])
    assert [p.name for p in tracer.files()] == ["r.jsonl"]
    assert tracer.path.stat().st_size <= 1024


@pytest.mark.parametrize("kwargs", [{"sample_rate": 1.5}, {"max_bytes": 10}, {"backups": -1}])
def test_bad_settings(tmp_path: Path, kwargs: dict) -> None:
    with pytest.raises(ValueError):
        RejectionTracer(tmp_path / "r.jsonl", **kwargs)


def _known_trace(tmp_path: Path) -> Path:
    """12 events: 6 at 09:xx, 4 at 14:xx, 2 at 23:xx UTC; token 13 rejected 7 times (target wanted 99)."""
    now = [T0]
    tracer = RejectionTracer(tmp_path / "known.jsonl", sample_rate=1.0, detokenizer=_Words(), clock=lambda: now[0])
    plan = [  # (hours after T0, seq_len, k, accepted, drafted, target)
        *[(0, 10, 4, 2, [11, 12, 13, 14], [11, 12, 99, 1])] * 5,  # first rejected 3, bucket 0-32
        (0.5, 40, 4, 0, [20, 21, 22, 23], [30, 31, 32, 33]),  # first rejected 1, 32-64
        *[(5, 300, 5, 2, [11, 12, 13, 14, 15], [11, 12, 99])] * 2,  # first rejected 3, 256-512
        *[(5, 600, 5, 0, [40, 41, 42, 43, 44], [50])] * 2,  # first rejected 1, 512+
        *[(14, 100, 2, 1, [60, 61], [60, 62])] * 2,  # first rejected 2, 64-128 (23:15 UTC)
    ]
    for hours, seq_len, k, acc, drafted, target in plan:
        now[0] = T0 + hours * 3600
        tracer.record("r", _outcome(k, acc, seq_len), drafted, target)
    with tracer.path.open("a") as f:
        f.write("{not json\n")
    return tracer.path


def test_summary_of_a_known_trace(tmp_path: Path) -> None:
    s = summarize([_known_trace(tmp_path)], top=2)
    assert s.events == 12 and s.bad_lines == 1
    assert s.by_position == {3: 7, 1: 3, 2: 2}
    assert s.by_bucket == {"0-32": 5, "32-64": 1, "64-128": 2, "256-512": 2, "512+": 2}
    assert list(s.by_bucket) == [b for b in M.BUCKET_LABELS if b in s.by_bucket]  # in length order
    assert s.by_hour == {9: 6, 14: 4, 23: 2}
    assert s.top_tokens[0] == {
        "token": 13, "text": "w13", "rejections": 7, "target_instead": 99, "target_instead_text": "w99"
    }
    assert s.top_tokens[1]["token"] == 40 and s.top_tokens[1]["rejections"] == 2
    assert s.mean_k == pytest.approx((5 * 4 + 4 + 2 * 5 + 2 * 5 + 2 * 2) / 12)


def test_cli_summarize(tmp_path: Path) -> None:
    path = _known_trace(tmp_path)
    result = runner.invoke(app, ["summarize", str(path), "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert out["events"] == 12
    assert out["by_position"] == {"1": 3, "2": 2, "3": 7}
    assert out["by_hour_utc"] == {"09": 6, "14": 4, "23": 2}
    assert out["top_rejected_tokens"][0]["token"] == 13
    assert out["first_time"] == "2025-03-03T09:15:00+00:00"

    text = runner.invoke(app, ["summarize", str(path)])
    assert text.exit_code == 0
    assert "12 rejection events" in text.stdout and "1 malformed lines skipped" in text.stdout
    assert "first rejected position:" in text.stdout and "09:00" in text.stdout
    assert "'w13'" in text.stdout and "'w99'" in text.stdout

    missing = runner.invoke(app, ["summarize", str(tmp_path / "nope.jsonl")])
    assert missing.exit_code == 1 and "trace file not found" in missing.output


def test_recorder_offers_rejections_to_the_tracer(tmp_path: Path) -> None:
    tracer = RejectionTracer(tmp_path / "r.jsonl", sample_rate=1.0)
    metrics = SpecMetrics(PrometheusClientSink(), tracer=tracer)
    metrics.iteration(_outcome(3, 1), request_id="x", drafted=[1, 2, 3], target_tokens=[1, 5, 6])
    metrics.iteration(_outcome(3, 3), request_id="x", drafted=[1, 2, 3], target_tokens=[1, 2, 3])
    metrics.iteration(_outcome(3, 0))  # no tokens given: counted, not traced
    assert metrics.errors == 0
    assert tracer.offered == 1 and tracer.written == 1
    (event,) = read_events([tracer.path])[0]
    assert event["request_id"] == "x" and event["first_rejected"] == 2
