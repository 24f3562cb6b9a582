"""``trtspec serve``: run a real tritonserver on a model repository until SIGINT/SIGTERM.

Beside Triton's endpoints it serves the deployment's truthful status on
``--status-port`` (``GET /status``, ``GET /ready``: do draft and target
actually answer, breaker state, speculation on or off; see
:mod:`trtspec.serving.status`), which ``trtspec status --url HOST:PORT`` prints.
"""

from __future__ import annotations

import signal
from pathlib import Path
from types import FrameType
from typing import Annotated

import typer

from trtspec.cli.common import JsonOpt, domain_errors, fail, log, print_json


class _Shutdown(Exception):
    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _raise_shutdown(signum: int, _frame: FrameType | None) -> None:
    raise _Shutdown(signum)


def serve(
    model_repo: Annotated[Path, typer.Option("--model-repo", "-m", help="Model repository (spec_decode, target, draft).")],
    host: Annotated[str, typer.Option("--host", help="Address to listen on; 0.0.0.0 is every interface.")] = "0.0.0.0",
    http_port: Annotated[int, typer.Option("--http-port", help="HTTP port; 0 picks a free one.")] = 8000,
    grpc_port: Annotated[int, typer.Option("--grpc-port", help="gRPC port; 0 picks a free one.")] = 8001,
    metrics_port: Annotated[int, typer.Option("--metrics-port", help="Prometheus metrics port; 0 picks a free one.")] = 8002,
    status_port: Annotated[int, typer.Option("--status-port", help="Status endpoint (GET /status, /ready); 0 picks a free one, -1 turns it off.")] = 8003,
    log_file: Annotated[Path, typer.Option("--log-file", help="Where the server log goes (appended).")] = Path("tritonserver.log"),
    startup_timeout: Annotated[float, typer.Option("--startup-timeout", help="Seconds to wait for every model to be ready.")] = 600.0,
    log_verbose: Annotated[int, typer.Option("--log-verbose", help="tritonserver --log-verbose level.")] = 0,
    malloc: Annotated[str, typer.Option("--malloc", help="Allocator preloaded into tritonserver: auto (jemalloc, else tcmalloc, else glibc's) | system | jemalloc | tcmalloc.")] = "auto",
    json_out: JsonOpt = False,
) -> None:
    """Start tritonserver on MODEL_REPO, print its endpoints, serve until Ctrl-C or SIGTERM."""
    from trtspec.serving.launcher import TritonServer, find_tritonserver, malloc_library
    from trtspec.serving.status import StatusServer

    if not (model_repo / "spec_decode" / "config.pbtxt").is_file():
        fail(f"{model_repo} is not a trtspec model repository (no spec_decode/config.pbtxt)")
    previous = {s: signal.signal(s, _raise_shutdown) for s in (signal.SIGINT, signal.SIGTERM)}
    server: TritonServer | None = None
    status_server: StatusServer | None = None
    try:
        with domain_errors():
            install = find_tritonserver()
            allocator = malloc_library(malloc) or "glibc malloc"
            log(f"starting {install.executable} ({install.source}, {allocator}); log: {log_file.resolve()}",
                quiet=json_out)
            server = TritonServer(
                model_repo,
                host=host,
                http_port=http_port,
                grpc_port=grpc_port,
                metrics_port=metrics_port,
                log_file=log_file,
                startup_timeout_s=startup_timeout,
                log_verbose=log_verbose,
                install=install,
                malloc=malloc,
            )
            endpoints = server.start()
        urls = endpoints.to_dict()
        if status_port >= 0:
            try:
                status_server = StatusServer(endpoints.http, server.status_dir, host=host, port=status_port).start()
            except OSError as e:
                fail(f"cannot serve the status endpoint on {host}:{status_port}: {e.strerror or e}")
            urls["status"] = status_server.url
        info = {
            "endpoints": urls,
            "pid": server.pid,
            "server": str(install.executable),
            "model_repo": str(model_repo.resolve()),
            "log_file": str(Path(log_file).resolve()),
        }
        if json_out:
            print_json(info)
        else:
            for name, url in urls.items():
                typer.echo(f"{name:<16}{url}")
            from trtspec.serving.status import collect_status, format_status

            for line in format_status(collect_status(endpoints.http, server.status_dir)):
                log(line)
            log("serving; Ctrl-C or SIGTERM stops the server", quiet=False)
        code = server.wait()
        tail = server.log_tail(5)
        fail(f"tritonserver exited on its own with code {code}; last log lines:\n{tail}")
    except _Shutdown as s:
        log(f"{s} received: stopping tritonserver", quiet=json_out)
    finally:
        # Keep further signals from interrupting the shutdown itself.
        for sig in previous:
            signal.signal(sig, signal.SIG_IGN)
        try:
            if status_server is not None:
                status_server.stop()
            if server is not None:
                server.stop()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
    log("tritonserver stopped", quiet=json_out)
