"""Faults injected into the served draft (real models, real server of this module's own):
late drafts are dropped and persistent lateness opens the breaker; wrong and failing drafts
never change a greedy output."""

from __future__ import annotations

import time

import pytest
from reliability_helpers import PROMPTS, STATIC_POLICY, control, metric, model_status, own_server, wait_for

from trtspec.serving.client import GenerateParams, generate_grpc, generate_http

BREAKER_POLICY = """
draft_length:
  controller: static
  static: {k: 5}
breaker: {enabled: true, min_tokens: 10, window_tokens: 100, cooldown_s: 600}
fallback: {enabled: false}
"""


@pytest.fixture(scope="module")
def slow(tmp_path_factory, tiny_target, tiny_draft):
    """Every draft forward pass sleeps 0.3 s; the deadline before any measurement is 0.15 s."""
    with own_server(
        tmp_path_factory.mktemp("slow"), tiny_target, tiny_draft, policy=BREAKER_POLICY,
        spec_decode={"draft_timeout_max_s": 0.15}, draft_params={"fault_delay_s": 0.3},
    ) as s:
        yield s


def test_late_drafts_are_dropped_and_persistent_lateness_opens_the_breaker(slow, reference):
    grpc = slow.endpoints.grpc
    for i, p in enumerate(PROMPTS[:2]):
        t0 = time.monotonic()
        r = generate_grpc(grpc, p, GenerateParams(max_tokens=30))
        took = time.monotonic() - t0
        assert r.output_ids == reference(p, 30).token_ids  # degraded, not wrong
        assert r.num_draft_tokens == 0  # the late proposal was dropped
        assert took < 5.0, f"request {i} waited for the slow draft ({took:.1f}s)"
    st = wait_for(lambda: (c := control(slow)).get("breaker", {}).get("state") == "open" and c, 10,
                  "the breaker to open")
    assert st["draft"]["deadline"]["late"] >= 2 and st["speculation"] == "off"
    assert st["speculation_reason"] == "breaker open"
    before = metric(slow, "trtspec_route_decisions_total", reason="breaker_open")
    r = generate_grpc(grpc, PROMPTS[2], GenerateParams(max_tokens=30))
    assert r.output_ids == reference(PROMPTS[2], 30).token_ids and r.num_draft_tokens == 0
    assert metric(slow, "trtspec_route_decisions_total", reason="breaker_open") == before + 1
    assert metric(slow, "trtspec_drafted_tokens_total") == 0  # late proposals are not counted as drafted
    assert metric(slow, "trtspec_fallbacks_total", reason="draft_error") >= 2
    # the draft is slow, not dead: never reloaded
    assert st["draft"]["reloads"] == 0 and st["draft"]["state"] in ("healthy", "suspect")


@pytest.fixture(scope="module")
def faulty(tmp_path_factory, tiny_target, tiny_draft):
    """Half the drafted tokens wrong, one draft forward pass in ten raising."""
    with own_server(
        tmp_path_factory.mktemp("faulty"), tiny_target, tiny_draft, policy=STATIC_POLICY,
        draft_params={"fault_wrong_share": 0.5, "fault_fail_share": 0.1, "fault_seed": 3},
    ) as s:
        yield s


def test_wrong_and_failing_drafts_never_change_a_greedy_output(faulty, reference):
    grpc, http = faulty.endpoints.grpc, faulty.endpoints.http
    assert model_status(faulty, "draft")["faults"]["wrong_share"] == 0.5
    drafted = accepted = 0
    for i, p in enumerate(PROMPTS):
        r = (generate_http(http, p, GenerateParams(max_tokens=60), stream=True) if i % 2
             else generate_grpc(grpc, p, GenerateParams(max_tokens=60)))
        assert r.output_ids == reference(p, 60).token_ids, f"prompt {i} differs"
        drafted += r.num_draft_tokens
        accepted += r.num_accepted_tokens
    assert drafted > 0 and accepted / drafted < 0.6  # the wrong half is rejected
    assert metric(faulty, "trtspec_fallbacks_total", reason="draft_error") > 0  # failures happened, were absorbed
    # a request's outcome is recorded just after its final response: polled
    wait_for(lambda: metric(faulty, "trtspec_requests_total", outcome="ok") >= len(PROMPTS), 10, "every request counted")
