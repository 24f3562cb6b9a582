"""Per-request figures: tokens per chunk, inter-token latency, error categories."""

from __future__ import annotations

import pytest

from trtspec.bench.records import RequestRecord, categorize, chunk_tokens


def test_chunk_tokens() -> None:
    assert chunk_tokens([3, 5, 2], 3) == [1, 1, 1]  # one token per chunk: speculation off
    # 10 tokens over chunks of 1, 11, 21 characters: 7 extra shared 0 : 10 : 20 -> 0, 2.33, 4.67 -> 0, 2, 5
    assert chunk_tokens([1, 11, 21], 10) == [1, 3, 6]
    assert chunk_tokens([4, 4], 7) == [4, 3]  # ties: the earlier chunk gets the odd token
    assert chunk_tokens([1, 1], 6) == [3, 3]  # no character information: even shares
    assert chunk_tokens([], 5) == []
    assert sum(chunk_tokens([5, 9, 13, 2], 23)) == 23


def test_latencies_of_one_request() -> None:
    # sent at 1.0, chunks at +0.1 (1 token), +0.3 (3 tokens), +0.4 (1 token), final at +0.5
    r = RequestRecord(0, "auto", 5, arrival_s=0.9, sent_s=1.0, done_s=1.5, chunks=[(0.1, 1), (0.3, 7), (0.4, 1)],
                      output_tokens=5, drafted=6, accepted=3)
    assert r.answered and r.speculated
    assert r.lag_s == pytest.approx(0.1)
    assert r.ttft_s == pytest.approx(0.1)
    assert r.e2e_s == pytest.approx(0.5)
    assert r.tpot_s == pytest.approx(0.4 / 4)
    assert r.chunk_tokens() == [1, 3, 1]
    assert r.itl_s() == pytest.approx([0.2 / 3, 0.1])
    assert r.mean_chunk_interval_s() == pytest.approx(0.15)
    back = RequestRecord.from_dict(r.to_dict())
    assert back == r


def test_a_failed_request_has_no_latencies() -> None:
    r = RequestRecord(0, "off", 5, 0.0, sent_s=0.0, done_s=2.0, chunks=[(0.5, 3)], error="boom", error_category="other")
    assert not r.answered and r.ttft_s is None and r.e2e_s is None and r.itl_s() == []


@pytest.mark.parametrize(("message", "code", "category"), [
    ("failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:1: Connection refused", None, "refused"),
    ("cannot reach localhost:1: [Errno 111] Connection refused", "UNAVAILABLE", "refused"),
    ("failed to connect to all addresses", "StatusCode.UNAVAILABLE", "refused"),
    ("Socket closed", "StatusCode.UNAVAILABLE", "unavailable"),
    ("cannot reach localhost:1: [Errno 111] Connection refused", None, "refused"),
    ("no final response within 5s", None, "timeout"),
    ("request cancelled by the client", None, "cancelled"),
    ("the server is shutting down", None, "unavailable"),
    ("model 'target' failed: Stub process 'target_0_0' is not healthy.", None, "unavailable"),
    ("internal error: RuntimeError: boom", None, "internal"),
    ("max_tokens must be <= 200 (this server's limit), got 500", None, "invalid"),
    ("Request for unknown model: 'x' is not found", None, "invalid"),
    ("anything", "INVALID_ARG", "invalid"),
    ("something odd", None, "other"),
])
def test_categorize(message: str, code: str | None, category: str) -> None:
    assert categorize(message, code) == category
