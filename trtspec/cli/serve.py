"""``trtspec serve``: run a real tritonserver on a model repository until SIGINT/SIGTERM.

SIGTERM or SIGINT drains (:mod:`trtspec.serving.drain`): readiness turns false
at once, new requests are refused with ``UNAVAILABLE``, requests in flight
finish within ``--grace-period`` (past it they end with a one-line error and
are counted), then the server stops and the command exits 0. A second signal
stops at once.

Beside Triton's endpoints it serves the deployment's truthful status on
``--status-port`` (``GET /status``, ``GET /ready``: do draft and target
actually answer, breaker state, speculation on or off; see
:mod:`trtspec.serving.status`), which ``trtspec status --url HOST:PORT`` prints.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Annotated

import typer

from trtspec.cli.common import JsonOpt, domain_errors, fail, log, print_json

if TYPE_CHECKING:
    from trtspec.serving.launcher import TritonServer
    from trtspec.serving.openai_api.server import OpenAIServer
    from trtspec.serving.status import StatusServer


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
    openai_port: Annotated[int, typer.Option("--openai-port", help="OpenAI-compatible endpoint (/v1/completions, /v1/chat/completions); 0 picks a free port, -1 (default) turns it off.")] = -1,
    openai_model_name: Annotated[str | None, typer.Option("--openai-model-name", help="With --openai-port: the model id clients name (GET /v1/models, a request's \"model\"), e.g. the checkpoint's Hugging Face id; default: the Triton model's name.")] = None,
    openai_api_key: Annotated[str | None, typer.Option("--openai-api-key", envvar="TRTSPEC_OPENAI_API_KEY", show_envvar=True, help="With --openai-port: /v1/* requests must send 'Authorization: Bearer KEY' (401 otherwise; /health and /metrics stay open). The environment variable keeps the key out of the process list.")] = None,
    log_file: Annotated[Path, typer.Option("--log-file", help="Where the server log goes (appended).")] = Path("tritonserver.log"),
    startup_timeout: Annotated[float, typer.Option("--startup-timeout", help="Seconds to wait for every model to be ready.")] = 600.0,
    log_verbose: Annotated[int, typer.Option("--log-verbose", help="tritonserver --log-verbose level.")] = 0,
    malloc: Annotated[str, typer.Option("--malloc", help="Allocator preloaded into tritonserver: auto (jemalloc, else tcmalloc, else glibc's) | system | jemalloc | tcmalloc.")] = "auto",
    grace_period: Annotated[float, typer.Option("--grace-period", min=0.0, help="On SIGTERM/SIGINT, seconds requests in flight get to finish (new ones are refused); a second signal stops at once.")] = 30.0,
    json_out: JsonOpt = False,
) -> None:
    """Start tritonserver on MODEL_REPO, print its endpoints, serve until Ctrl-C or SIGTERM (then drain)."""
    from trtspec.builder.repo import served_model_name
    from trtspec.serving.launcher import TritonServer, check_ports_free, find_tritonserver, malloc_library  # noqa: F811

    for option, value in (("--openai-model-name", openai_model_name), ("--openai-api-key", openai_api_key)):
        if value is not None and (openai_port < 0 or not value.strip()):
            fail(f"{option} needs --openai-port" if openai_port < 0 else f"{option} is empty")
    model = served_model_name(model_repo) if model_repo.is_dir() else None
    if model is None or not (model_repo / model / "config.pbtxt").is_file():
        fail(f"{model_repo} is not a trtspec model repository (no spec_decode model in it)")
    with domain_errors():  # now, not after every model has loaded
        check_ports_free(host, {"--http-port": http_port, "--grpc-port": grpc_port, "--metrics-port": metrics_port,
                                "--status-port": status_port, "--openai-port": openai_port})
    previous = {s: signal.signal(s, _raise_shutdown) for s in (signal.SIGINT, signal.SIGTERM)}
    running = _Running()
    at_once = False
    try:
        with domain_errors():
            install = find_tritonserver()
            allocator = malloc_library(malloc) or "glibc malloc"
            log(f"starting {install.executable} ({install.source}, {allocator}); log: {log_file.resolve()}",
                quiet=json_out)
            running.server = server = TritonServer(
                model_repo, host=host, http_port=http_port, grpc_port=grpc_port, metrics_port=metrics_port,
                log_file=log_file, startup_timeout_s=startup_timeout, log_verbose=log_verbose, install=install,
                malloc=malloc,
            )
            endpoints = server.start()
        urls = {**endpoints.to_dict(model), **running.open_front_doors(host, status_port, openai_port, model,
                                                                               openai_model_name, openai_api_key)}
        info = {"endpoints": urls, "model": model, "pid": server.pid, "server": str(install.executable),
                "model_repo": str(model_repo.resolve()), "log_file": str(Path(log_file).resolve())}
        _announce(info, server, json_out)
        code = server.wait()
        why = server.known_abort()
        tail = server.log_tail(5)
        fail(f"tritonserver exited on its own with code {code}{f': {why}' if why else ''}; last log lines:\n{tail}")
    except _Shutdown as s:
        if running.server is not None and running.server.alive():
            at_once = _drain(running.server, grace_period, str(s))
        else:
            log(f"{s} received: stopping tritonserver", quiet=json_out)
    finally:
        # Keep further signals from interrupting the shutdown itself.
        for sig in previous:
            signal.signal(sig, signal.SIG_IGN)
        try:
            running.stop(at_once)
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
    log("tritonserver stopped", quiet=json_out)


@dataclass
class _Running:
    """What ``trtspec serve`` started, to stop in order."""

    server: TritonServer | None = None
    status: StatusServer | None = None
    openai: OpenAIServer | None = None

    def open_front_doors(self, host: str, status_port: int, openai_port: int, model: str,
                         openai_model_name: str | None = None, openai_api_key: str | None = None) -> dict[str, str]:
        """Start the status and OpenAI endpoints (a port of -1: not started); their URLs."""
        from trtspec.serving.openai_api.server import OpenAIServer
        from trtspec.serving.status import StatusServer

        assert self.server is not None and self.server.endpoints is not None
        http, grpc, status_dir = self.server.endpoints.http, self.server.endpoints.grpc, self.server.status_dir
        urls = {}
        if status_port >= 0:
            try:
                self.status = StatusServer(http, status_dir, host=host, port=status_port, model=model).start()
            except OSError as e:
                fail(f"cannot serve the status endpoint on {host}:{status_port}: {e.strerror or e}")
            urls["status"] = self.status.url
        if openai_port >= 0:
            with domain_errors():
                self.openai = OpenAIServer(grpc, model=model, served_name=openai_model_name, host=host,
                                           port=openai_port, status_dir=status_dir, api_key=openai_api_key).start()
            urls["openai"] = f"{self.openai.url}/v1"
        return urls

    def stop(self, at_once: bool) -> None:
        # Front doors close once the drain is over: until then they pass spec_decode's
        # refusals (UNAVAILABLE) on to their clients.
        if self.openai is not None:
            self.openai.stop()
        if self.status is not None:
            self.status.stop()
        if self.server is not None:
            self.server.stop(timeout_s=0.0 if at_once else 30.0)


def _announce(info: dict, server: TritonServer, json_out: bool) -> None:
    """The endpoints on stdout (the JSON object under ``--json``), the deployment's status on stderr."""
    if json_out:
        print_json(info)
        return
    from trtspec.serving.status import collect_status, format_status

    for name, url in info["endpoints"].items():
        typer.echo(f"{name:<16}{url}")
    for line in format_status(collect_status(server.endpoints.http, server.status_dir, model=info["model"])):
        log(line)
    log("serving; Ctrl-C or SIGTERM stops the server", quiet=False)


def _drain(server: TritonServer, grace_period: float, signame: str) -> bool:
    """Drain ``server`` (readiness false, new requests refused, in-flight ones finish within the grace);
    True when a second signal cut it short (stop at once). Logged also under ``--json``: how a
    shutdown went is what an operator reads afterwards."""
    log(f"{signame} received: draining, up to {grace_period:g}s for requests in flight "
        "(new ones are refused); a second signal stops at once", quiet=False)
    try:
        report = server.drain(grace_period)
    except _Shutdown as again:
        log(f"{again} received again: stopping at once", quiet=False)
        return True
    log(f"drained in {report.seconds:.1f}s: {report.in_flight_at_start} request(s) were in flight, "
        f"{report.cut} ended at the grace period, {report.refused} refused while draining"
        + (f", {report.in_flight_at_end} still in flight" if report.in_flight_at_end else ""), quiet=False)
    return False
