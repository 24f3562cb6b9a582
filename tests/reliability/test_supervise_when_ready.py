"""Supervision starts only once Triton says it is ready: before that every probe would fail with
"Server not ready" and every reload would find no HTTP endpoint, condemning healthy models. And no
probe goes to a model Triton says is loading."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from trtspec.control import SpeculationGovernor
from trtspec.serving.launcher import TRITON_URL_ENV
from trtspec.serving.triton.health import DeploymentHealth, HealthConfig
from trtspec.testing import fake_triton


class _Readiness(BaseHTTPRequestHandler):
    ready = threading.Event()
    asked = 0

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        type(self).asked += 1
        ok = self.path == "/v2/health/ready" and self.ready.is_set()
        self.send_response(200 if ok else 503)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args) -> None:
        pass


class _Thread:
    """Stands in for a SupervisorThread: records that it was started."""

    def __init__(self) -> None:
        self.started = threading.Event()

    def start(self) -> _Thread:
        self.started.set()
        return self

    def stop(self, timeout_s: float = 1.0) -> None:
        pass


def test_supervisors_start_only_when_the_server_is_ready(monkeypatch):
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Readiness)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    monkeypatch.setenv(TRITON_URL_ENV, f"http://127.0.0.1:{httpd.server_address[1]}")
    health = DeploymentHealth(fake_triton, HealthConfig(), SpeculationGovernor(), model_name="spec_decode", pool_size=2)
    fake = _Thread()
    health._threads.append(fake)  # type: ignore[arg-type]
    try:
        health.start()
        assert not fake.started.wait(1.0), "supervision started while the server said it was not ready"
        assert _Readiness.asked >= 2  # it kept asking
        _Readiness.ready.set()
        assert fake.started.wait(5.0), "supervision did not start once the server was ready"
    finally:
        health.stop()
        httpd.shutdown()


class _Index(BaseHTTPRequestHandler):
    """Triton's repository index: the draft is LOADING until ``loaded`` is set."""

    loaded = threading.Event()
    asked = 0

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        type(self).asked += 1
        state = "READY" if self.loaded.is_set() else "LOADING"
        body = json.dumps([{"name": "draft", "version": "1", "state": state}]).encode()
        self.send_response(200 if self.path == "/v2/repository/index" else 404)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


def test_no_probe_while_triton_says_the_model_is_loading():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Index)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{httpd.server_address[1]}"
    health = DeploymentHealth(fake_triton, HealthConfig(), SpeculationGovernor(), model_name="spec_decode", pool_size=2)
    done = threading.Event()
    waiter = threading.Thread(target=lambda: (health._wait_while_loading(url, "draft"), done.set()), daemon=True)
    try:
        waiter.start()
        assert not done.wait(1.0), "the probe went ahead while the model was loading"
        assert _Index.asked >= 2  # it kept asking
        _Index.loaded.set()
        assert done.wait(5.0), "the probe did not go ahead once the model was loaded"
    finally:
        health.stop()
        httpd.shutdown()
