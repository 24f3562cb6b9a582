"""``trtspec bench``: load a running server, speculation auto vs off interleaved; JSON, plots and a report."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from trtspec.cli.common import JsonOpt, check_output_dir, domain_errors, err_console, fail, log, print_json


def bench(
    url: Annotated[str, typer.Option("--url", help="Server HOST:PORT (the gRPC port; the HTTP port with --http; the OpenAI endpoint with --openai).")],
    metrics_url: Annotated[str | None, typer.Option("--metrics-url", help="Triton's metrics endpoint, e.g. http://HOST:8002/metrics: memory curve and server counters.")] = None,
    rate: Annotated[float | None, typer.Option("--rate", help="Open loop: Poisson arrivals at R requests/s (up to 200).")] = None,
    concurrency: Annotated[int | None, typer.Option("--concurrency", help="Closed loop: C requests in flight.")] = None,
    duration: Annotated[float | None, typer.Option("--duration", help="Seconds of arrivals (default 30 unless --requests).")] = None,
    requests: Annotated[int | None, typer.Option("--requests", help="Number of requests to send.")] = None,
    prompts: Annotated[Path | None, typer.Option("--prompts", help="JSONL prompts: {\"prompt\": ..., \"max_tokens\": ..., \"priority\": ...} per line (default: the built-in set).")] = None,
    max_tokens: Annotated[str, typer.Option("--max-tokens", help="Output length: N, or LO-HI drawn uniformly per request.")] = "64",
    ab: Annotated[str, typer.Option("--ab", help="Speculation arms, interleaved: auto,off (equal) or auto:3,off:1 (weights).")] = "auto,off",
    drafter: Annotated[str | None, typer.Option("--drafter", help="What drafts for the speculating arms' requests: model, ngram, suffix or auto (default: the server's default_drafter).")] = None,
    slo_ttft_ms: Annotated[float | None, typer.Option("--slo-ttft-ms", help="SLO on time to first token (goodput).")] = None,
    slo_itl_ms: Annotated[float | None, typer.Option("--slo-itl-ms", help="SLO on time per output token after the first (goodput).")] = None,
    timeout: Annotated[float, typer.Option("--timeout", help="Seconds a request may take before it is cancelled and counted as a timeout.")] = 60.0,
    http: Annotated[bool, typer.Option("--http", help="Triton's HTTP generate_stream endpoint instead of gRPC streaming.")] = False,
    openai: Annotated[bool, typer.Option("--openai", help="The OpenAI-compatible endpoint (trtspec serve --openai-port) instead of Triton's; its API key, if it asks one, from $OPENAI_API_KEY.")] = False,
    server_pid: Annotated[int | None, typer.Option("--server-pid", help="PID of a local tritonserver: sample its processes' memory (RSS, PSS).")] = None,
    memory_interval: Annotated[float, typer.Option("--memory-interval", help="Seconds between memory samples.")] = 1.0,
    seed: Annotated[int, typer.Option("--seed", help="Seed of arrivals, prompt choice and output lengths.")] = 0,
    probe: Annotated[bool, typer.Option("--probe/--no-probe", help="Measure the client's own max send rate first (0.5 s).")] = True,
    out: Annotated[Path, typer.Option("--out", help="Directory for results.json, the PNGs and report.md/.html.")] = Path("bench-results"),
    json_out: JsonOpt = False,
) -> None:
    """Benchmark a running server with speculation auto vs off on the same traffic."""
    from trtspec.bench import (
        ArmSplit,
        BenchConfig,
        OutputLength,
        builtin_prompts,
        load_prompts,
        run_bench,
        text_summary,
        write_report,
    )

    if duration is None and requests is None:
        duration = 30.0
    if http and openai:
        fail("give at most one of --http and --openai")
    with domain_errors():
        cfg = BenchConfig(
            url=url,
            prompts=load_prompts(prompts) if prompts is not None else builtin_prompts(),
            workload_split=ArmSplit.parse(ab),
            output=OutputLength.parse(max_tokens),
            rate=rate,
            concurrency=concurrency,
            duration_s=duration,
            requests=requests,
            timeout_s=timeout,
            protocol="http" if http else ("openai" if openai else "grpc"),
            metrics_url=metrics_url,
            server_pid=server_pid,
            memory_interval_s=memory_interval,
            slo_ttft_ms=slo_ttft_ms,
            slo_itl_ms=slo_itl_ms,
            seed=seed,
            drafter=drafter,
            probe=probe,
        )
        check_output_dir(out, "--out")  # before the run, not after it
        if json_out:
            result = run_bench(cfg)
        else:
            result = _run_with_progress(cfg, run_bench)
        files = write_report(result, out)
    overall = result.summary["overall"]
    if json_out:
        print_json({
            "config": result.config,
            "client": result.client,
            "summary": result.summary,
            "memory": result.memory_summary,
            "interrupted": result.interrupted,
            "files": files,
        })
    else:
        typer.echo(text_summary(result))
        for kind, path in files.items():
            log(f"{kind:<15}{path}")
    if result.interrupted:
        log("interrupted: the report covers the requests sent before; those in flight were cancelled")
        raise typer.Exit(130)
    if overall["sent"] and not overall["answered"]:
        cats = ", ".join(f"{k} {v}" for k, v in overall["errors_by_category"].items())
        fail(f"no request was answered ({cats}); see {files['markdown']}")


def _run_with_progress(cfg, run_bench):
    """Run with a Rich progress bar on stderr (sent, answered, errors, in flight)."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    columns = (
        TextColumn("[bold]bench[/]"),
        BarColumn(),
        TextColumn("{task.fields[stats]}"),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=err_console, transient=False) as bar:
        planned = None
        task = bar.add_task("bench", total=None, stats="starting")

        def update(p) -> None:
            nonlocal planned
            total = p.planned if p.planned is not None else None
            if total != planned:
                planned = total
                bar.update(task, total=total)
            done = p.answered + p.errors
            bar.update(
                task,
                completed=done if total is not None else 0,
                stats=f"sent {p.sent}  answered {p.answered}  errors {p.errors}  in flight {p.in_flight}  {p.elapsed_s:5.1f}s",
            )

        return run_bench(cfg, progress=update)
