"""The load generator: open loop (Poisson arrivals) or closed loop (a fixed concurrency), on asyncio.

One event loop does everything: it sends every request at its arrival time
(open loop: never waiting for answers, so a slow server cannot slow the
arrivals; a late send shows as the request's lag), reads the streams,
samples the server's memory every ``memory_interval_s``, and reports progress.
Every request that was sent ends with a record, answered or with an error
(timeout, refused, ...): nothing is dropped silently. Ctrl-C cancels what is
in flight; those requests are recorded as errors (``cancelled``:
"interrupted") and the partial result is still returned.

Before the run, :meth:`Transport.probe` measures the client's own maximum send
rate (half a second of refused requests) so a report can say whether the
client or the server was the limit.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone

from trtspec.bench import memory as mem
from trtspec.bench.records import CANCELLED, OTHER, RequestRecord
from trtspec.bench.stats import summarize
from trtspec.bench.transport import GrpcTransport, HttpTransport, OpenAITransport, Transport
from trtspec.bench.workload import (
    ArmSplit,
    OutputLength,
    Prompt,
    RequestSpec,
    Workload,
    WorkloadError,
    poisson_arrivals,
)
from trtspec.errors import one_line
from trtspec.wire import DRAFTERS

RESULTS_VERSION = 1
MAX_RATE = 200.0  # requests/s: what operators test at; the client must hold it


@dataclass
class Progress:
    """What the progress display shows; updated in place."""

    planned: int | None  # requests to send (None: closed loop by duration)
    sent: int = 0
    answered: int = 0
    errors: int = 0
    elapsed_s: float = 0.0
    duration_s: float | None = None

    @property
    def in_flight(self) -> int:
        return self.sent - self.answered - self.errors


ProgressFn = Callable[[Progress], None]


PROTOCOLS = ("grpc", "http", "openai")
DEFAULT_DRAFTER = "default"  # a run whose requests named no drafter: the server's default_drafter drafted


@dataclass
class BenchConfig:
    url: str
    prompts: list[Prompt]
    workload_split: ArmSplit
    output: OutputLength
    rate: float | None = None  # open loop, requests/s
    concurrency: int | None = None  # closed loop
    duration_s: float | None = None
    requests: int | None = None
    timeout_s: float = 60.0
    protocol: str = "grpc"  # grpc | http (Triton's generate_stream) | openai (the OpenAI-compatible endpoint)
    metrics_url: str | None = None
    server_pid: int | None = None  # a local server: sample its processes' memory
    memory_interval_s: float = 1.0
    slo_ttft_ms: float | None = None
    slo_itl_ms: float | None = None
    seed: int = 0
    drafter: str | None = None  # sent by the speculating arms; None: the server's default_drafter
    channels: int = 4
    probe: bool = True
    label: str = ""

    def __post_init__(self) -> None:
        if (self.rate is None) == (self.concurrency is None):
            raise WorkloadError("give exactly one of --rate (open loop) and --concurrency (closed loop)")
        if self.rate is not None and not 0 < self.rate <= MAX_RATE:
            raise WorkloadError(f"--rate must be in (0, {MAX_RATE:g}], got {self.rate:g}")
        if self.concurrency is not None and self.concurrency < 1:
            raise WorkloadError(f"--concurrency must be >= 1, got {self.concurrency}")
        if self.duration_s is None and self.requests is None:
            raise WorkloadError("give --duration or --requests")
        if self.duration_s is not None and not self.duration_s > 0:
            raise WorkloadError(f"--duration must be > 0, got {self.duration_s:g}")
        if self.requests is not None and self.requests < 1:
            raise WorkloadError(f"--requests must be >= 1, got {self.requests}")
        if not self.timeout_s > 0:
            raise WorkloadError(f"--timeout must be > 0, got {self.timeout_s:g}")
        if self.protocol not in PROTOCOLS:
            raise WorkloadError(f"protocol must be one of {', '.join(PROTOCOLS)}; got {self.protocol!r}")
        if self.drafter is not None and self.drafter not in DRAFTERS:
            raise WorkloadError(f"--drafter must be one of {', '.join(DRAFTERS)}; got {self.drafter!r}")
        if self.drafter is not None and self.workload_split.arms == ("off",):
            raise WorkloadError("--drafter needs a speculating arm in --ab (auto or on): the off arm sends no drafter")

    @property
    def mode(self) -> str:
        return "open" if self.rate is not None else "closed"

    def describe(self) -> dict:
        return {
            "url": self.url,
            "protocol": self.protocol,
            "mode": self.mode,
            "rate_rps": self.rate,
            "concurrency": self.concurrency,
            "duration_s": self.duration_s,
            "requests": self.requests,
            "timeout_s": self.timeout_s,
            "ab": str(self.workload_split),
            "ab_shares": self.workload_split.shares(),
            "max_tokens": str(self.output),
            "prompts": len(self.prompts),
            "metrics_url": self.metrics_url,
            "server_pid": self.server_pid,
            "slo_ttft_ms": self.slo_ttft_ms,
            "slo_itl_ms": self.slo_itl_ms,
            "seed": self.seed,
            "drafter": self.drafter,
            "label": self.label,
        }


@dataclass
class BenchResult:
    config: dict
    started_at: str
    records: list[RequestRecord]
    summary: dict
    client: dict
    memory: list[mem.MemorySample] = field(default_factory=list)
    memory_summary: dict = field(default_factory=dict)
    server_counters: dict = field(default_factory=dict)
    interrupted: bool = False

    @property
    def drafter(self) -> str:
        """What drafted for the speculating arms: ``--drafter``, else ``default`` (results of older runs too)."""
        return self.config.get("drafter") or DEFAULT_DRAFTER

    def to_dict(self) -> dict:
        return {
            "version": RESULTS_VERSION,
            "kind": "trtspec-bench",
            "started_at": self.started_at,
            "interrupted": self.interrupted,
            "config": self.config,
            "client": self.client,
            "summary": self.summary,
            "memory": {"summary": self.memory_summary, "samples": [s.to_dict() for s in self.memory]},
            "server_counters": self.server_counters,
            "requests": [r.to_dict() for r in self.records],
        }


def make_transport(cfg: BenchConfig) -> Transport:
    if cfg.protocol == "http":
        return HttpTransport(cfg.url)
    if cfg.protocol == "openai":
        return OpenAITransport(cfg.url)
    return GrpcTransport(cfg.url, channels=cfg.channels)


def run_bench(cfg: BenchConfig, progress: ProgressFn | None = None) -> BenchResult:
    """Run one benchmark (blocking); see the module docstring."""
    return asyncio.run(_run(cfg, progress))


async def _run(cfg: BenchConfig, progress: ProgressFn | None) -> BenchResult:
    transport = make_transport(cfg)
    try:
        probe_rps = await transport.probe(0.5) if cfg.probe else None
        return await _measure(cfg, transport, progress, probe_rps)
    finally:
        await transport.close()


async def _measure(cfg: BenchConfig, transport: Transport, progress: ProgressFn | None,
                   probe_rps: float | None) -> BenchResult:
    loop = asyncio.get_running_loop()
    started_at = datetime.now(timezone.utc).isoformat()
    before = await loop.run_in_executor(None, mem.try_scrape, cfg.metrics_url)
    run = _Run(cfg, transport)
    cpu0 = time.process_time()
    interrupted = await run.drive(progress)
    cpu_s = time.process_time() - cpu0
    if progress is not None:
        progress(run.state)
    answered = sum(r.answered for r in run.records)
    after = await loop.run_in_executor(None, mem.scrape_settled, cfg.metrics_url, before, answered)
    if cfg.metrics_url or cfg.server_pid:
        run.samples.append(await loop.run_in_executor(None, mem.sample, run.clock(), after, cfg.server_pid))
    deltas = mem.counter_deltas(before, after) if before is not None and after is not None else {}
    run.records.sort(key=lambda r: r.index)
    summary = summarize(run.records, arms=cfg.workload_split.arms, slo_ttft_ms=cfg.slo_ttft_ms,
                        slo_itl_ms=cfg.slo_itl_ms, server_deltas=deltas)
    return BenchResult(
        config=cfg.describe(),
        started_at=started_at,
        records=run.records,
        summary=summary,
        client=_client_figures(cfg, summary, cpu_s, run.state, probe_rps),
        memory=run.samples,
        memory_summary=mem.summarize_memory(run.samples),
        server_counters={"scraped": before is not None and after is not None, "deltas": deltas},
        interrupted=interrupted,
    )


def _client_figures(cfg: BenchConfig, summary: dict, cpu_s: float, state: Progress, probe_rps: float | None) -> dict:
    sent, lag = state.sent, summary["overall"]["lag_ms"]
    return {
        "max_send_rate_rps": probe_rps,
        # the client's own CPU over the run (all its threads): per request, and in cores. A high lag with
        # a CPU share far below 1 means the client was starved by other processes (a co-located server).
        "cpu_s": cpu_s,
        "cpu_ms_per_request": 1000 * cpu_s / sent if sent else None,
        "cpu_cores": cpu_s / state.elapsed_s if state.elapsed_s > 0 else None,
        "achieved_send_rate_rps": summary["achieved_send_rate_rps"],
        "lag_ms_p99": lag.get("p99"),
        # the client is the limit when it cannot send at twice the target rate, or sends late
        "client_bound": bool(
            (cfg.rate is not None and probe_rps is not None and probe_rps < 2 * cfg.rate)
            or (lag.get("p99") is not None and lag["p99"] > 100.0)
        ),
    }


class _Run:
    """One run's requests: sent on arrivals (open loop) or by workers (closed loop), each ending with
    its record, beside a progress ticker and the server's memory sampler."""

    def __init__(self, cfg: BenchConfig, transport: Transport) -> None:
        self.cfg, self.transport = cfg, transport
        self.specs = Workload(cfg.prompts, cfg.output, cfg.workload_split, seed=cfg.seed, drafter=cfg.drafter).requests()
        self.arrivals = (
            poisson_arrivals(cfg.rate, duration_s=cfg.duration_s, count=cfg.requests, seed=cfg.seed)
            if cfg.rate is not None
            else None
        )
        planned = len(self.arrivals) if self.arrivals is not None else cfg.requests
        self.state = Progress(planned=planned, duration_s=cfg.duration_s)
        self.records: list[RequestRecord] = []
        self.samples: list[mem.MemorySample] = []
        self.tasks: set[asyncio.Task] = set()
        self._t0 = time.perf_counter()

    def clock(self) -> float:
        return time.perf_counter() - self._t0

    async def drive(self, progress: ProgressFn | None) -> bool:
        """Send every request and wait for them; True when the run was interrupted (cancelled)."""
        self._t0 = time.perf_counter()
        background = [asyncio.ensure_future(self._ticker(progress))]
        if self.cfg.metrics_url or self.cfg.server_pid:
            background.append(asyncio.ensure_future(self._sampler()))
        try:
            await (self._open_loop() if self.arrivals is not None else self._closed_loop())
            return False
        except asyncio.CancelledError:
            for t in list(self.tasks):
                t.cancel()
            await asyncio.gather(*list(self.tasks), return_exceptions=True)
            return True
        finally:
            for b in background:
                b.cancel()
            await asyncio.gather(*background, return_exceptions=True)
            self.state.elapsed_s = self.clock()

    def _record(self, arrival: float) -> tuple[RequestRecord, RequestSpec]:
        """The next request's spec and its record, counted as sent."""
        spec = next(self.specs)
        rec = RequestRecord(spec.index, spec.arm, spec.max_tokens, arrival)
        self.records.append(rec)
        self.state.sent += 1
        return rec, spec

    async def _one(self, rec: RequestRecord, spec: RequestSpec) -> None:
        try:
            await self.transport.send(spec, rec, self.clock, self.cfg.timeout_s)
        except asyncio.CancelledError:
            self._failed(rec, "interrupted: the run was stopped", CANCELLED)
            raise
        except Exception as e:  # a client-side failure is that request's error, not the run's
            self._failed(rec, one_line(f"client error: {type(e).__name__}: {e}"), OTHER)
        finally:
            if rec.error is None and rec.done_s is not None:
                self.state.answered += 1
            else:
                self.state.errors += 1

    def _failed(self, rec: RequestRecord, error: str, category: str) -> None:
        rec.done_s = self.clock()
        if rec.sent_s is None:
            rec.sent_s = rec.done_s
        rec.error, rec.error_category = error, category

    async def _open_loop(self) -> None:
        assert self.arrivals is not None
        for at in self.arrivals:
            delay = at - self.clock()
            if delay > 0:
                await asyncio.sleep(delay)
            task = asyncio.ensure_future(self._one(*self._record(at)))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)
        while self.tasks:
            await asyncio.gather(*list(self.tasks), return_exceptions=True)

    async def _closed_loop(self) -> None:
        assert self.cfg.concurrency is not None
        taken = itertools.count()
        end, requests = self.cfg.duration_s, self.cfg.requests

        async def worker() -> None:
            while not (end is not None and self.clock() >= end) and not (
                requests is not None and next(taken) >= requests
            ):
                await self._one(*self._record(self.clock()))

        await asyncio.gather(*(worker() for _ in range(self.cfg.concurrency)))

    async def _ticker(self, progress: ProgressFn | None) -> None:
        while True:
            self.state.elapsed_s = self.clock()
            if progress is not None:
                progress(self.state)
            await asyncio.sleep(0.25)

    async def _sampler(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            t = self.clock()
            metrics = await loop.run_in_executor(None, mem.try_scrape, self.cfg.metrics_url)
            self.samples.append(await loop.run_in_executor(None, mem.sample, t, metrics, self.cfg.server_pid))
            await asyncio.sleep(max(0.0, self.cfg.memory_interval_s - (self.clock() - t)))



def result_from_dict(d: dict) -> BenchResult:
    """A :class:`BenchResult` back from its JSON (``to_dict``)."""
    if not isinstance(d, dict) or d.get("kind") != "trtspec-bench":
        raise WorkloadError("not a trtspec bench result (no \"kind\": \"trtspec-bench\")")
    return BenchResult(
        config=d["config"],
        started_at=d.get("started_at", ""),
        records=[RequestRecord.from_dict(r) for r in d.get("requests", [])],
        summary=d["summary"],
        client=d.get("client", {}),
        memory=[mem.MemorySample(**s) for s in d.get("memory", {}).get("samples", [])],
        memory_summary=d.get("memory", {}).get("summary", {}),
        server_counters=d.get("server_counters", {}),
        interrupted=bool(d.get("interrupted", False)),
    )

