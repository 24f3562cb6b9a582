"""BenchConfig's checks, what a run records of its configuration, and an interrupted run (no server)."""

from __future__ import annotations

import asyncio

import pytest

from trtspec.bench.records import CANCELLED
from trtspec.bench.runner import BenchConfig, BenchResult, _measure
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


class _Hanging:
    """A transport whose requests never answer (the boundary: no server here)."""

    name = "hanging"

    async def send(self, spec, rec, clock, timeout_s) -> None:
        rec.sent_s = clock()
        await asyncio.sleep(3600)

    async def probe(self, duration_s: float = 1.0, concurrency: int = 64) -> float:
        return 0.0

    async def close(self) -> None:
        return None


@pytest.mark.parametrize("loop", ["open", "closed"])
def test_an_interrupted_run_records_every_sent_request_and_returns_its_result(loop: str) -> None:
    """Ctrl-C (the run's task cancelled): the requests in flight end as ``cancelled`` errors, and the
    partial result still comes back, marked interrupted."""
    cfg = config(rate=50.0, requests=20) if loop == "open" else config(rate=None, concurrency=3, requests=20)

    async def interrupted() -> BenchResult:
        run = asyncio.ensure_future(_measure(cfg, _Hanging(), None, None))
        await asyncio.sleep(0.3)
        run.cancel()
        return await run

    result = asyncio.run(interrupted())
    assert result.interrupted
    sent = len(result.records)
    assert (1 <= sent < 20) if loop == "open" else sent == 3  # closed loop: one request per worker in flight
    assert all(r.error_category == CANCELLED and r.done_s is not None for r in result.records)
    assert result.client["cpu_ms_per_request"] is not None
