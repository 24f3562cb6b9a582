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
from trtspec.bench.workload import ArmSplit, OutputLength, Prompt, Workload, WorkloadError, poisson_arrivals
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
    workload = Workload(cfg.prompts, cfg.output, cfg.workload_split, seed=cfg.seed, drafter=cfg.drafter)
    specs = workload.requests()
    records: list[RequestRecord] = []
    tasks: set[asyncio.Task] = set()
    arrivals = (
        poisson_arrivals(cfg.rate, duration_s=cfg.duration_s, count=cfg.requests, seed=cfg.seed)
        if cfg.rate is not None
        else None
    )
    state = Progress(planned=len(arrivals) if arrivals is not None else cfg.requests, duration_s=cfg.duration_s)
    started_at = datetime.now(timezone.utc).isoformat()
    before = await loop.run_in_executor(None, mem.try_scrape, cfg.metrics_url)
    cpu0 = time.process_time()
    t0 = time.perf_counter()

    def clock() -> float:
        return time.perf_counter() - t0

    samples: list[mem.MemorySample] = []

    async def sampler() -> None:
        while True:
            t = clock()
            metrics = await loop.run_in_executor(None, mem.try_scrape, cfg.metrics_url)
            samples.append(await loop.run_in_executor(None, mem.sample, t, metrics, cfg.server_pid))
            await asyncio.sleep(max(0.0, cfg.memory_interval_s - (clock() - t)))

    async def one(rec: RequestRecord, spec) -> None:
        try:
            await transport.send(spec, rec, clock, cfg.timeout_s)
        except asyncio.CancelledError:
            rec.done_s = clock()
            if rec.sent_s is None:
                rec.sent_s = rec.done_s
            rec.error, rec.error_category = "interrupted: the run was stopped", CANCELLED
            raise
        except Exception as e:  # a client-side failure is that request's error, not the run's
            rec.done_s = clock()
            if rec.sent_s is None:
                rec.sent_s = rec.done_s
            rec.error, rec.error_category = one_line(f"client error: {type(e).__name__}: {e}"), OTHER
        finally:
            if rec.error is None and rec.done_s is not None:
                state.answered += 1
            else:
                state.errors += 1

    def launch(arrival: float) -> None:
        spec = next(specs)
        rec = RequestRecord(spec.index, spec.arm, spec.max_tokens, arrival)
        records.append(rec)
        state.sent += 1
        task = asyncio.ensure_future(one(rec, spec))
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    async def ticker() -> None:
        while True:
            state.elapsed_s = clock()
            if progress is not None:
                progress(state)
            await asyncio.sleep(0.25)

    async def open_loop() -> None:
        assert arrivals is not None
        for at in arrivals:
            delay = at - clock()
            if delay > 0:
                await asyncio.sleep(delay)
            launch(at)
        while tasks:
            await asyncio.gather(*list(tasks), return_exceptions=True)

    async def closed_loop() -> None:
        assert cfg.concurrency is not None
        taken = itertools.count()
        end = cfg.duration_s

        async def worker() -> None:
            while True:
                if end is not None and clock() >= end:
                    return
                if cfg.requests is not None and next(taken) >= cfg.requests:
                    return
                spec = next(specs)
                rec = RequestRecord(spec.index, spec.arm, spec.max_tokens, clock())
                records.append(rec)
                state.sent += 1
                await one(rec, spec)

        await asyncio.gather(*(worker() for _ in range(cfg.concurrency)))

    background = [asyncio.ensure_future(ticker())]
    if cfg.metrics_url or cfg.server_pid:
        background.append(asyncio.ensure_future(sampler()))
    interrupted = False
    try:
        await (open_loop() if arrivals is not None else closed_loop())
    except asyncio.CancelledError:
        interrupted = True
        for t in list(tasks):
            t.cancel()
        await asyncio.gather(*list(tasks), return_exceptions=True)
    finally:
        for b in background:
            b.cancel()
        await asyncio.gather(*background, return_exceptions=True)
    state.elapsed_s = clock()
    cpu_s = time.process_time() - cpu0
    if progress is not None:
        progress(state)
    answered = sum(r.answered for r in records)
    after = await loop.run_in_executor(None, mem.scrape_settled, cfg.metrics_url, before, answered)
    if cfg.metrics_url or cfg.server_pid:
        samples.append(await loop.run_in_executor(None, mem.sample, clock(), after, cfg.server_pid))
    deltas = mem.counter_deltas(before, after) if before is not None and after is not None else {}
    records.sort(key=lambda r: r.index)
    summary = summarize(records, arms=cfg.workload_split.arms, slo_ttft_ms=cfg.slo_ttft_ms,
                        slo_itl_ms=cfg.slo_itl_ms, server_deltas=deltas)
    lag = summary["overall"]["lag_ms"]
    client = {
        "max_send_rate_rps": probe_rps,
        # the client's own CPU over the run (all its threads): per request, and in cores. A high lag with
        # a CPU share far below 1 means the client was starved by other processes (a co-located server).
        "cpu_s": cpu_s,
        "cpu_ms_per_request": 1000 * cpu_s / len(records) if records else None,
        "cpu_cores": cpu_s / state.elapsed_s if state.elapsed_s > 0 else None,
        "achieved_send_rate_rps": summary["achieved_send_rate_rps"],
        "lag_ms_p99": lag.get("p99"),
        # the client is the limit when it cannot send at twice the target rate, or sends late
        "client_bound": bool(
            (cfg.rate is not None and probe_rps is not None and probe_rps < 2 * cfg.rate)
            or (lag.get("p99") is not None and lag["p99"] > 100.0)
        ),
    }
    return BenchResult(
        config=cfg.describe(),
        started_at=started_at,
        records=records,
        summary=summary,
        client=client,
        memory=samples,
        memory_summary=mem.summarize_memory(samples),
        server_counters={"scraped": before is not None and after is not None, "deltas": deltas},
        interrupted=interrupted,
    )


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

