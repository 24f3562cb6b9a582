"""Fixtures of the observability tests: promtool, a real Prometheus, the Prometheus HTTP API."""

from __future__ import annotations

import json
import math
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml

from trtspec.serving.launcher import free_port

NOT_INSTALLED = "{tool} not installed: run scripts/ci_setup.sh (Debian package 'prometheus')"


@pytest.fixture(scope="session")
def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        pytest.skip(NOT_INSTALLED.format(tool="promtool"))
    return path


@pytest.fixture(scope="session")
def prometheus_bin() -> str:
    path = shutil.which("prometheus")
    if path is None:
        pytest.skip(NOT_INSTALLED.format(tool="prometheus"))
    return path


class Prometheus:
    """A real Prometheus server scraping ``targets`` every second, on a free loopback port."""

    def __init__(self, binary: str, work: Path, targets: list[str], rule_files: list[Path] = ()) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s", "scrape_timeout": "1s"},
            "rule_files": [str(p) for p in rule_files],
            "scrape_configs": [{"job_name": "trtspec", "static_configs": [{"targets": targets}]}],
        }
        work.mkdir(parents=True, exist_ok=True)
        (work / "prometheus.yml").write_text(yaml.safe_dump(config))
        self.log = work / "prometheus.log"
        self._log = self.log.open("wb")
        self.proc = subprocess.Popen(
            [
                binary,
                f"--config.file={work / 'prometheus.yml'}",
                f"--storage.tsdb.path={work / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--storage.tsdb.retention.time=1h",
            ],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 30
        while not self._ready():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"prometheus did not start:\n{self.log.read_text()[-2000:]}")
            time.sleep(0.2)

    def _ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=1) as r:
                return r.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def api(self, path: str, **params: str) -> dict:
        url = f"{self.url}/api/v1/{path}" + (f"?{urllib.parse.urlencode(params)}" if params else "")
        try:
            with urllib.request.urlopen(url, timeout=10) as r:
                body = json.loads(r.read())
        except urllib.error.HTTPError as e:
            body = json.loads(e.read())
        assert body.get("status") == "success", f"{path} {params}: {body}"
        return body["data"]

    def query(self, expr: str) -> list[dict]:
        """The instant vector ``expr`` returns now (a scalar result is wrapped as one sample)."""
        data = self.api("query", query=expr)
        if data["resultType"] == "vector":
            return data["result"]
        if data["resultType"] == "scalar":
            return [{"metric": {}, "value": data["result"]}]
        raise AssertionError(f"{expr}: unexpected result type {data['resultType']}")

    def wait_for(self, expr: str, ok: Callable[[list[dict]], bool], timeout_s: float = 20.0) -> list[dict]:
        deadline = time.monotonic() + timeout_s
        while True:
            result = self.query(expr)
            if ok(result) or time.monotonic() > deadline:
                return result
            time.sleep(0.5)

    @staticmethod
    def has_number(result: list[dict]) -> bool:
        """The query returned data, and at least one sample is a number (not NaN)."""
        return any(not math.isnan(float(s["value"][1])) for s in result)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self._log.close()


@pytest.fixture
def start_prometheus(prometheus_bin: str, tmp_path: Path) -> Iterator[Callable[..., Prometheus]]:
    """``start_prometheus(targets, rule_files=[...])``: a running Prometheus, stopped after the test."""
    started: list[Prometheus] = []

    def start(targets: list[str], rule_files: list[Path] = ()) -> Prometheus:
        p = Prometheus(prometheus_bin, tmp_path / f"prometheus{len(started)}", targets, list(rule_files))
        started.append(p)
        return p

    yield start
    for p in started:
        p.stop()
