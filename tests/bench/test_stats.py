"""Run figures from hand-made records: accounting, percentiles, goodput, acceptance, speedup."""

from __future__ import annotations

import pytest

from trtspec.bench.records import RequestRecord
from trtspec.bench.stats import (
    acceptance_by_drafter,
    acceptance_by_position_estimate,
    acceptance_by_position_server,
    summarize,
)


def rec(i, arm, sent, ttft, e2e, tokens, drafted=0, accepted=0, chunks=None, error=None, cat=None):
    chunks = chunks if chunks is not None else [(ttft, 1)] + [(ttft + (e2e - ttft) * j / (tokens - 1), 1) for j in range(1, tokens)]
    return RequestRecord(i, arm, tokens, arrival_s=sent, sent_s=sent, done_s=sent + e2e, chunks=[] if error else chunks,
                         output_tokens=0 if error else tokens, drafted=drafted, accepted=accepted,
                         error=error, error_category=cat)


def records():
    return [
        # auto: 2 answered (10 tokens each), 1 timeout
        # (the first chunk of a request is the prefill's one token, no draft)
        rec(0, "auto", 0.0, 0.1, 1.0, 10, drafted=10, accepted=8, chunks=[(0.1, 1), (0.55, 20), (1.0, 20)]),
        rec(1, "auto", 1.0, 0.2, 2.0, 10, drafted=10, accepted=6, chunks=[(0.2, 1), (1.1, 20), (2.0, 20)]),
        rec(2, "auto", 2.0, 0, 3.0, 10, error="no final response within 3s", cat="timeout"),
        # off: 2 answered, 1 refused
        rec(3, "off", 0.5, 0.05, 2.0, 10),
        rec(4, "off", 1.5, 0.3, 1.5, 10),
        rec(5, "off", 2.5, 0, 0.01, 10, error="connection refused", cat="refused"),
    ]


def test_accounting_and_per_arm_figures() -> None:
    s = summarize(records(), arms=("auto", "off"), slo_ttft_ms=250, slo_itl_ms=150)
    o = s["overall"]
    assert (o["sent"], o["answered"], o["errors"]) == (6, 4, 2)
    assert s["accounted"] is True
    assert o["errors_by_category"] == {"timeout": 1, "refused": 1}
    # wall time: first send 0.0, last answer 3.0 + 2.0 = 5.0 (the timeout ends at 5.0 too)
    assert s["wall_s"] == pytest.approx(5.0)
    auto, off = s["by_arm"]["auto"], s["by_arm"]["off"]
    assert (auto["sent"], auto["answered"], auto["errors"]) == (3, 2, 1)
    assert auto["acceptance_rate"] == pytest.approx(14 / 20)
    assert auto["k_estimate"] == 5  # per request ceil(10 drafted / (3 chunks - the prefill's)) = 5
    assert off["acceptance_rate"] is None and off["speculated_share"] == 0.0
    assert auto["ttft_ms"]["p50"] == pytest.approx(150.0)  # 100 and 200
    assert auto["e2e_ms"]["p50"] == pytest.approx(1500.0)
    assert auto["tokens_per_s"] == pytest.approx(20 / 5.0)
    # SLO: TTFT <= 250 ms and TPOT <= 150 ms.
    # auto 0: TPOT 0.9/9 = 0.1 ok; auto 1: 1.8/9 = 0.2 fails; off 3: TTFT 50 ms, TPOT 1.95/9 = 0.217 fails;
    # off 4: TTFT 300 ms fails.
    assert auto["goodput_rps"] == pytest.approx(1 / 5.0)
    assert auto["slo_attainment"] == pytest.approx(1 / 3)  # of SENT requests
    assert off["goodput_rps"] == 0.0
    # ms per token: auto medians (100, 200) -> 150; off (200, 150) -> 175; speedup 175 / 150
    assert s["speedup_vs_off"]["auto"] == pytest.approx(175 / 150)
    # mean chunk interval: auto (0.45, 0.9) -> 0.675 s; off (1.95/9, 1.2/9) -> median 0.175 s
    assert auto["chunk_interval_ms_p50"] == pytest.approx(675.0)
    assert off["chunk_interval_ms_p50"] == pytest.approx(1000 * (1.95 / 9 + 1.2 / 9) / 2)


def test_unaccounted_requests_are_caught() -> None:
    rs = records()
    rs[0].done_s = None  # sent, neither answered nor failed: a request the client lost
    with pytest.raises(AssertionError, match="unaccounted"):
        summarize(rs, arms=("auto", "off"))


def test_acceptance_by_position() -> None:
    # k = ceil(10 drafted / 2 drafting chunks) = 5. Chunk tokens: req 0: [1, 20, 20] chars,
    # 10 tokens: 7 extra shared 0 : 19 : 19 -> 0, 3.5, 3.5 -> 0, 4, 3 (largest remainder, first
    # wins the tie) -> tokens [1, 5, 4]; first (prefill) and last chunk left out -> accepted 4;
    # req 1 the same. Positions 1-4: 2/2, 5: 0/2.
    est = acceptance_by_position_estimate(records())
    assert est["iterations"] == 2
    assert est["by_position"] == {"1": 1.0, "2": 1.0, "3": 1.0, "4": 1.0, "5": 0.0}
    deltas = {
        "trtspec_drafted_tokens_by_position_total": {"position=1": 10.0, "position=2": 8.0, "position=16+": 0.0},
        "trtspec_accepted_tokens_by_position_total": {"position=1": 9.0, "position=2": 6.0},
    }
    srv = acceptance_by_position_server(deltas)
    assert srv == {"source": "server counters", "by_position": {"1": 0.9, "2": 0.75}}
    by_drafter = {  # a server that labels them by drafter too: summed by position
        "trtspec_drafted_tokens_by_position_total": {"drafter=model,position=1": 6.0, "drafter=suffix,position=1": 4.0,
                                                     "drafter=model,position=2": 8.0},
        "trtspec_accepted_tokens_by_position_total": {"drafter=model,position=1": 6.0, "drafter=suffix,position=1": 3.0,
                                                      "drafter=model,position=2": 6.0},
    }
    assert acceptance_by_position_server(by_drafter)["by_position"] == {"1": 0.9, "2": 0.75}
    assert acceptance_by_position_server({}) is None


def test_acceptance_by_drafter_from_the_servers_counters() -> None:
    deltas = {
        "trtspec_drafted_tokens_total": {"drafter=model": 10.0, "drafter=ngram": 40.0, "drafter=suffix": 0.0},
        "trtspec_accepted_tokens_total": {"drafter=model": 9.0, "drafter=ngram": 10.0},
    }
    assert acceptance_by_drafter(deltas) == {
        "model": {"drafted": 10.0, "accepted": 9.0, "acceptance_rate": 0.9},
        "ngram": {"drafted": 40.0, "accepted": 10.0, "acceptance_rate": 0.25},
    }  # suffix drafted nothing: left out
    assert acceptance_by_drafter({"trtspec_drafted_tokens_total": {"all": 5.0}}) is None  # an older server
