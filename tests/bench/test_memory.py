"""Metrics scraping and process memory (real /proc, a real child process)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest

from trtspec.bench import memory as mem

TEXT = """# HELP nv_cpu_memory_used_bytes CPU used memory (RAM), in bytes
# TYPE nv_cpu_memory_used_bytes gauge
nv_cpu_memory_used_bytes 2522427392
nv_gpu_memory_used_bytes{gpu_uuid="GPU-a"} 100
nv_gpu_memory_used_bytes{gpu_uuid="GPU-b"} 50
trtspec_requests_total{model="spec_decode",outcome="ok"} 7
trtspec_requests_total{model="spec_decode",outcome="error"} 1
trtspec_model_memory_bytes{model="spec_decode",role="draft"} 1e6
trtspec_weird{model="a\\"b"} NaN
"""


def test_parse_and_total() -> None:
    m = mem.parse_prometheus(TEXT)
    assert mem.total(m, "nv_cpu_memory_used_bytes") == 2522427392
    assert mem.total(m, "nv_gpu_memory_used_bytes") == 150
    assert mem.total(m, "trtspec_requests_total", outcome="ok") == 7
    assert mem.total(m, "absent") is None
    s = mem.sample(1.5, m, None)
    assert (s.host_used_bytes, s.gpu_used_bytes, s.model_bytes) == (2522427392, 150, {"draft": 1e6})


def test_counter_deltas() -> None:
    before = mem.parse_prometheus(TEXT)
    after = mem.parse_prometheus(TEXT.replace("} 7", "} 12") + 'trtspec_drafted_tokens_total{model="spec_decode"} 40\n')
    d = mem.counter_deltas(before, after)
    assert d["trtspec_requests_total"] == {"outcome=ok": 5.0, "outcome=error": 0.0}
    assert d["trtspec_drafted_tokens_total"] == {"all": 40.0}  # appeared during the run: counted from 0
    assert "nv_cpu_memory_used_bytes" not in d


class _Counting(BaseHTTPRequestHandler):
    """A metrics port whose ok-request counter grows by one per scrape, from 7."""

    text, scrapes = TEXT, 0

    def do_GET(self) -> None:
        cls = type(self)
        body = cls.text.replace("} 7", f"}} {7 + cls.scrapes}").encode()
        cls.scrapes += 1
        self.send_response(200)
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def counting_port():
    server = HTTPServer(("127.0.0.1", 0), _Counting)
    _Counting.text, _Counting.scrapes = TEXT, 0
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}/metrics"
    server.shutdown()
    server.server_close()


def test_the_closing_scrape_waits_for_the_server_to_count_the_answered(counting_port) -> None:
    before = mem.try_scrape(counting_port)  # ok = 7
    after = mem.scrape_settled(counting_port, before, answered=3)
    assert mem.counter_deltas(before, after)["trtspec_requests_total"]["outcome=ok"] == 3
    assert _Counting.scrapes == 4


def test_the_closing_scrape_does_not_wait_without_a_request_counter(counting_port) -> None:
    assert mem.scrape_settled(counting_port, None, answered=3) is not None  # nothing to compare with
    _Counting.text = "\n".join(line for line in TEXT.splitlines() if "trtspec_requests_total" not in line)
    before = mem.try_scrape(counting_port)  # not a trtspec server
    _Counting.scrapes = 0
    assert mem.scrape_settled(counting_port, before, answered=3) is not None
    assert _Counting.scrapes == 1


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc")
def test_process_tree_and_memory_sum_children() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; x = bytearray(50 * 2**20); time.sleep(30)"])
    try:
        import time

        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            rss, pss, n = mem.process_memory(os.getpid())
            if child.pid in mem.process_tree(os.getpid()) and rss - (mem.process_memory(child.pid) or (0,))[0] > 0:
                child_rss = mem.process_memory(child.pid)[0]
                if child_rss > 50 * 2**20:
                    break
            time.sleep(0.1)
        assert child.pid in mem.process_tree(os.getpid())
        rss, pss, n = mem.process_memory(os.getpid())
        own = mem._kb_field(f"/proc/{os.getpid()}/status", "VmRSS:")
        assert n >= 2
        assert rss >= own + 50 * 2**20  # the child's 50 MiB buffer is in the sum
        assert pss is not None and pss > 50 * 2**20
    finally:
        child.kill()
        child.wait()
    assert mem.process_memory(child.pid) is None


def test_memory_summary_slope() -> None:
    samples = [mem.MemorySample(t, pss_bytes=int(1000 + 60 * t)) for t in range(5)]  # +60 bytes/s
    s = mem.summarize_memory(samples)
    assert s["pss_bytes"]["growth"] == 240
    assert s["pss_bytes"]["slope_bytes_per_min"] == pytest.approx(3600)
    assert s["pss_bytes"]["peak"] == 1240
