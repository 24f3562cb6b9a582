"""The truthful status: the endpoint ``trtspec serve`` exposes and ``trtspec status`` prints."""

from __future__ import annotations

import json
import socket
import threading
import urllib.error
import urllib.request

import pytest
import typer
from typer.testing import CliRunner

from trtspec.cli.status import status
from trtspec.serving.drain import start_drain
from trtspec.serving.launcher import free_port
from trtspec.serving.status import StatusServer, format_status


def _app() -> typer.Typer:
    app = typer.Typer()
    app.command("status")(status)

    @app.command("noop")
    def _noop() -> None:  # keeps "status" a subcommand, as in the real CLI
        pass

    return app


def test_status_of_a_healthy_deployment(triton):
    server = StatusServer(triton.endpoints.http, triton.status_dir).start()
    try:
        host, port = server.address
        result = CliRunner().invoke(_app(), ["status", "--url", f"{host}:{port}", "--json"])
        assert result.exit_code == 0, result.output
        st = json.loads(result.stdout)
        assert st["ready"] and st["server"] == {"live": True, "ready": True}
        for m in ("spec_decode", "target", "draft"):
            assert st["models"][m]["answers"] and st["models"][m]["triton_ready"], m
        assert st["models"]["draft"]["supervisor"]["state"] == "healthy"
        assert st["breaker"]["state"] == "closed" and st["speculation"] == "on"
        assert st["goodput"] is None  # this repository's policy is static: no estimates to show
        text = CliRunner().invoke(_app(), ["status", "--url", f"{host}:{port}"])
        assert text.exit_code == 0
        lines = text.stdout.splitlines()
        assert lines[0].split() == ["ready", "yes"]
        assert any(line.startswith("draft") and "answers" in line for line in lines)
        assert any(line.startswith("speculation") and " on " in line for line in lines)
        assert not any(line.startswith("goodput") for line in lines)
        ready = urllib.request.urlopen(f"http://{host}:{port}/ready", timeout=30)
        assert ready.status == 200 and json.loads(ready.read())["ready"]
    finally:
        server.stop()


def test_status_of_a_server_that_is_gone_is_not_ready(tmp_path):
    dead = f"127.0.0.1:{free_port()}"  # no Triton there
    server = StatusServer(dead, tmp_path).start()
    try:
        host, port = server.address
        result = CliRunner().invoke(_app(), ["status", "--url", f"{host}:{port}"])
        assert result.exit_code == 2, result.output
        assert result.stdout.splitlines()[0].split() == ["ready", "NO"]
        try:
            urllib.request.urlopen(f"http://{host}:{port}/ready", timeout=30)
            raise AssertionError("/ready answered 200 for a dead server")
        except urllib.error.HTTPError as e:
            assert e.code == 503
    finally:
        server.stop()


def test_a_draining_server_is_not_ready_at_once_and_its_models_are_not_asked(tmp_path):
    triton = socket.create_server(("127.0.0.1", 0))  # takes connections, never answers: a probe would hang
    asked: list[socket.socket] = []

    def take() -> None:
        while True:
            try:
                asked.append(triton.accept()[0])
            except OSError:  # closed
                return

    threading.Thread(target=take, daemon=True).start()
    start_drain(tmp_path, 30.0)
    server = StatusServer(f"127.0.0.1:{triton.getsockname()[1]}", tmp_path, timeout_s=1.0).start()
    try:
        host, port = server.address
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(f"http://{host}:{port}/ready", timeout=30)
        assert refused.value.code == 503
        body = json.loads(refused.value.read())
        assert body["ready"] is False and body["draining"]["grace_period_s"] == 30.0
        assert asked == []
        # /status still gives the whole picture, and `trtspec status` prints that the server drains
        with urllib.request.urlopen(f"http://{host}:{port}/status", timeout=30) as r:
            status = json.loads(r.read())
        assert status["ready"] is False and status["draining"]["grace_period_s"] == 30.0
        lines = format_status(status)
        assert lines[0].split() == ["ready", "NO"]
        assert "draining     yes: new requests refused, grace period 30.0s" in lines
    finally:
        server.stop()
        triton.close()
        for conn in asked:
            conn.close()


def test_status_without_a_status_endpoint_is_one_error_line():
    result = CliRunner().invoke(_app(), ["status", "--url", f"127.0.0.1:{free_port()}", "--timeout", "5"])
    assert result.exit_code == 1
    assert result.stderr.startswith("error: cannot reach the status endpoint") and result.stderr.count("\n") == 1


def test_the_goodput_line_says_what_k_the_controller_would_draft_and_why():
    young = {"acceptance_per_position": [0.7, 0.7], "draft_cost_ratio": None, "k_best_now": 2,
             "breakeven_acceptance": 0.41, "young": True}
    line = next(x for x in format_status({"goodput": young}) if x.startswith("goodput"))
    assert "k now 2" in line and "0.70 0.70" in line and "draft cost not measured yet" in line
    assert "drafting pays above 0.41" in line and "young" in line
    costly = {**young, "draft_cost_ratio": 1.2, "k_best_now": 0, "breakeven_acceptance": 1.0, "young": False}
    line = next(x for x in format_status({"goodput": costly}) if x.startswith("goodput"))
    assert "costs 1.20 of a target step" in line and "nothing pays at any acceptance" in line
    assert "young" not in line
    lines = format_status({"k_choices": {"model:young": 8, "model:best": 40}})
    assert "model:best 40, model:young 8 (iterations, since start)" in next(x for x in lines if x.startswith("k chosen"))


def test_the_draft_line_says_its_deadline_what_it_is_made_of_and_how_many_calls_missed_it():
    from trtspec.serving.deadline import AdaptiveDeadline, Work

    d = AdaptiveDeadline(floor_s=0.01, max_s=2.0, multiplier=4.0, min_samples=4)

    def line(deadline: dict | None = None) -> str:
        draft = {"triton_ready": True, "answers": True, "latency_ms": 3.0,
                 "supervisor": {"state": "healthy", "deadline": deadline or d.snapshot()}}
        return next(x for x in format_status({"models": {"draft": draft}}) if x.startswith("draft"))

    assert "deadline 2000 ms (not measured yet); 0 late of 0 calls" in line()
    for _ in range(40):
        d.observe(0.05, Work(tokens=6, drafted=5))
    d.observe_late()
    assert "deadline 200 ms (4 x p95 50 ms; reads not measured yet); 1 late of 41 calls" in line()
    for _ in range(3):
        d.observe(0.45, Work(tokens=405, drafted=5))
    assert "+ 1.00 ms a token read" in line()
    older = {k: v for k, v in d.snapshot().items() if k not in ("multiplier", "read_s_per_token")}  # an older server's
    assert "(p95 450 ms; reads not measured yet)" in line(older)  # no multiplier, no read rate: not named
    d = AdaptiveDeadline(fixed_s=0.3)
    assert "deadline fixed at 300 ms" in line()
