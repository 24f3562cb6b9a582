"""``trtspec serve`` as a user starts it: a child process on free ports, for tests of signals and shutdown."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

STOP_S = 60.0  # the default --grace-period (30 s) and tritonserver's own exit
SERVE = "import typer; from trtspec.cli.serve import serve; typer.run(serve)"


@contextmanager
def serve_process(repo: Path, log_file: Path, *extra: str) -> Iterator[tuple[subprocess.Popen, dict]]:
    """Start ``trtspec serve --json`` (every port free, the OpenAI endpoint on) and yield the process and
    the JSON object it prints once ready. A process still running at the end is stopped as a user stops
    it (SIGTERM: it stops tritonserver), and killed if it has not ended within ``STOP_S`` (a killed
    ``trtspec serve`` leaves tritonserver and its stubs behind)."""
    args = [sys.executable, "-c", SERVE, "--model-repo", str(repo), "--host", "127.0.0.1", "--http-port", "0",
            "--grpc-port", "0", "--metrics-port", "0", "--status-port", "0", "--openai-port", "0",
            "--log-file", str(log_file), "--json", *extra]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        lines = []
        assert proc.stdout is not None
        for line in proc.stdout:  # the JSON object, printed once the server is ready
            lines.append(line)
            if line.startswith("}"):
                break
        if not lines:
            raise AssertionError(f"trtspec serve did not start: {proc.stderr.read() if proc.stderr else ''}")
        yield proc, json.loads("".join(lines))
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(STOP_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
