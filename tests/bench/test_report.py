"""The bench report's header names the drafter the speculating arms sent (no server)."""

from __future__ import annotations

from trtspec.bench.records import RequestRecord
from trtspec.bench.report import build_doc, text_summary
from trtspec.bench.runner import BenchConfig, BenchResult
from trtspec.bench.stats import summarize
from trtspec.bench.workload import ArmSplit, OutputLength, Prompt


def result(drafter: str | None) -> BenchResult:
    cfg = BenchConfig(url="localhost:1", prompts=[Prompt("p")], workload_split=ArmSplit.parse("auto,off"),
                      output=OutputLength.parse("2"), rate=1.0, requests=2, drafter=drafter)
    records = [RequestRecord(i, arm, 2, arrival_s=i, sent_s=i, done_s=i + 0.2, chunks=[(0.1, 1), (0.2, 1)],
                             output_tokens=2, finish_reason="length") for i, arm in enumerate(("auto", "off"))]
    return BenchResult(config=cfg.describe(), started_at="", records=records,
                       summary=summarize(records, arms=("auto", "off")), client={})


def test_header_names_the_drafter() -> None:
    images = {"latency_png": b"", "acceptance_png": b"", "memory_png": b""}
    assert "arms auto:1,off:1, drafter ngram" in text_summary(result("ngram")).splitlines()[0]
    assert "drafter of the speculating arms: ngram." in build_doc(result("ngram"), images).to_markdown()
    assert text_summary(result(None)).splitlines()[0].endswith("drafter default")
