"""BenchConfig's checks and what a run records of its configuration (no server)."""

from __future__ import annotations

import pytest

from trtspec.bench.runner import BenchConfig, BenchResult
from trtspec.bench.workload import ArmSplit, OutputLength, Prompt, WorkloadError


def config(**fields) -> BenchConfig:
    base = {"url": "localhost:1", "prompts": [Prompt("p")], "workload_split": ArmSplit.parse("auto,off"),
            "output": OutputLength.parse("8"), "rate": 1.0, "requests": 4}
    return BenchConfig(**(base | fields))


def test_drafter_is_recorded_in_the_results_config() -> None:
    assert config(drafter="ngram").describe()["drafter"] == "ngram"
    assert config().describe()["drafter"] is None  # the server's default_drafter


def test_a_bad_drafter_is_refused_in_one_line() -> None:
    with pytest.raises(WorkloadError, match=r"^--drafter must be one of model, ngram, suffix, auto; got 'oracle'$"):
        config(drafter="oracle")
    with pytest.raises(WorkloadError, match="needs a speculating arm"):
        config(drafter="ngram", workload_split=ArmSplit.parse("off"))


def test_result_drafter_of_new_and_older_results() -> None:
    def result(cfg: dict) -> BenchResult:
        return BenchResult(config=cfg, started_at="", records=[], summary={}, client={})

    assert result(config(drafter="suffix").describe()).drafter == "suffix"
    assert result(config().describe()).drafter == "default"
    assert result({"rate_rps": 1.0}).drafter == "default"  # a results.json written before --drafter existed
