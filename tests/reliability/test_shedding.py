"""spec_decode in-process (fake pb_utils, real tiny models): load shedding, the late and the fail-fast target."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from trtspec.testing.fake_triton import TritonError, fake_deployment


@pytest.fixture
def pb(tiny_target: Path, tiny_draft: Path, static_policy: Path):
    fake = fake_deployment(tiny_target, tiny_draft, max_tokens_limit=100, max_concurrency=1,
                           policy_file=str(static_policy), parameters={"max_queue": 1, "health_interval_s": 0})
    yield fake
    fake.finalize()


def test_beyond_the_queue_requests_are_refused_at_once_with_a_clear_error(pb):
    release = threading.Event()
    first_chunk = threading.Event()
    calls = [pb.client_request("spec_decode", {"text_input": "The quick brown fox", "max_tokens": 40, "stream": True}),
             pb.client_request("spec_decode", {"text_input": "Hello world", "max_tokens": 5}),
             pb.client_request("spec_decode", {"text_input": "Numbers 0 1 2", "max_tokens": 5})]

    def hold(resp, flags):  # the first request's worker waits here: one running, one queued
        first_chunk.set()
        release.wait(60)

    calls[0].sender.on_send = hold
    pb.execute("spec_decode", calls[:1])
    assert first_chunk.wait(60)
    pb.execute("spec_decode", calls[1:])
    calls[2].wait(10)  # refused at once, while the others still wait
    assert calls[2].error.code() == TritonError.UNAVAILABLE
    assert calls[2].error.message() == "server busy: 2 requests in flight; unavailable, retry later"
    assert not calls[1].sender.done.is_set()
    release.set()
    for c in calls[:2]:
        c.wait(60)
        assert c.error is None, c.error
    model = pb._models["spec_decode"].instance
    assert model.service.outcomes["unavailable"] == 1 and model.service.in_flight == 0


def test_while_the_target_is_known_down_requests_fail_fast(pb):
    model = pb._models["spec_decode"].instance
    pb.down.add("target")  # and the recovery cannot help yet (the fake re-probes with backoff)
    model.health.target.report_error("Stub process 'target_0_0' is not healthy.", fatal=True)
    try:
        calls_before = pb.bls_calls.get("target", 0)
        (c,) = [pb.client_request("spec_decode", {"text_input": "hi", "max_tokens": 5})]
        pb.execute("spec_decode", [c])
        c.wait(10)
        assert c.error.code() == TritonError.UNAVAILABLE
        assert c.error.message().startswith("model 'target' is unavailable (")
        assert c.error.message().endswith("; retry shortly") and "\n" not in c.error.message()
        assert pb.bls_calls.get("target", 0) - calls_before <= 2  # no call for the request (probes aside)
    finally:
        pb.down.discard("target")


def test_a_late_target_call_ends_the_request_with_one_line_and_the_server_recovers(tiny_target: Path, tiny_draft: Path,
                                                                                   static_policy: Path):
    """docs/reliability.md: a target call past its deadline ends the request with UNAVAILABLE, one line; once
    the target answers in time again (the supervisor's probe has a deadline of its own), requests pass."""
    pb = fake_deployment(tiny_target, tiny_draft, max_tokens_limit=100, policy_file=str(static_policy),
                         parameters={"target_timeout_s": 0.2, "timeout_per_token_s": 0.0})
    target = pb._models["target"].instance
    answer = target.execute
    target.execute = lambda requests: (time.sleep(1.0), answer(requests))[1]  # every target call 1 s late
    try:
        (late,) = pb.execute("spec_decode", [pb.client_request("spec_decode", {"text_input": "hi", "max_tokens": 5})])
        late.wait(30)
        assert late.error is not None and late.error.code() == TritonError.UNAVAILABLE
        assert late.error.message() == "model 'target' did not answer within 0.2s"
        target.execute = answer  # on time again
        model = pb._models["spec_decode"].instance
        deadline = time.monotonic() + 30
        while model.health.target.state.value != "healthy" and time.monotonic() < deadline:
            time.sleep(0.05)
        (ok,) = pb.execute("spec_decode", [pb.client_request("spec_decode", {"text_input": "hi", "max_tokens": 5})])
        ok.wait(30)
        assert ok.error is None, ok.error
    finally:
        pb.finalize()
