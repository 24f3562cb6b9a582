"""Real kills of real stubs (``kill -9``) on a server of this module's own: the draft's death
costs no request and no token, speculation resumes by itself; the target's death fails requests
fast with UNAVAILABLE, never a hang, and it comes back too.

The draft sleeps 5 ms in each forward pass, so that the kill under load can land inside the stub's
own work (``stubs.kill_stub_asleep``): a stub killed while it holds a lock it shares with Triton
makes Triton 2.51 abort the server 10 s later, which no recovery of ours can answer
(docs/reliability.md, "A stub killed mid-call")."""

from __future__ import annotations

import threading
import time

import pytest
from reliability_helpers import PROMPTS, STATIC_POLICY, control, own_server, wait_for

from trtspec.serving import stubs
from trtspec.serving.client import ClientError, GenerateParams, generate_grpc
from trtspec.serving.status import collect_status

RESUME_GOAL_S = 30.0


@pytest.fixture(scope="module")
def server(tmp_path_factory, tiny_target, tiny_draft):
    with own_server(
        tmp_path_factory.mktemp("kill"), tiny_target, tiny_draft, policy=STATIC_POLICY,
        spec_decode={"health_interval_s": 1.0, "reload_backoff_initial_s": 0.5},
        draft_params={"fault_delay_s": 0.005},
    ) as s:
        yield s


def test_killing_the_draft_stub_costs_no_request_and_speculation_resumes(server, reference):
    grpc = server.endpoints.grpc
    warm = generate_grpc(grpc, PROMPTS[0], GenerateParams(max_tokens=40))
    assert warm.num_draft_tokens > 0
    (old,) = stubs.stub_pids(server.pid)["draft"]
    # The precondition of "it does not answer" below: no draft call in flight at the kill. The warm request's
    # session release goes to the draft after its answer, and while spec_decode's status (written each
    # second) shows a call in flight, the status vouches for the draft instead of probing it.
    wait_for(lambda: not collect_status(server.endpoints.http, server.status_dir)["models"]["draft"].get("busy"),
             10, "the draft idle")

    # Target-only traffic all along: the draft's death and reload must not hold it up
    # (pb_utils.load_model would: it stalls every BLS call of spec_decode while the load runs).
    stop, latencies = threading.Event(), []

    def target_only_traffic() -> None:
        while not stop.is_set():
            t = time.monotonic()
            generate_grpc(grpc, PROMPTS[5], GenerateParams(max_tokens=8, speculation="off"))
            latencies.append(time.monotonic() - t)

    traffic = threading.Thread(target=target_only_traffic)
    traffic.start()
    killed_at = time.monotonic()
    stubs.kill_stub(server.pid, "draft")
    truth = collect_status(server.endpoints.http, server.status_dir)
    draft = truth["models"]["draft"]
    assert draft["triton_ready"] and not draft["answers"]  # Triton says ready; it does not answer
    assert truth["ready"]  # the service is: spec_decode and target answer

    for p in PROMPTS[:3]:  # right after the kill: every request succeeds, token for token the target's
        r = generate_grpc(grpc, p, GenerateParams(max_tokens=40))
        assert r.output_ids == reference(p, 40).token_ids and r.finish_reason == "length"

    st = wait_for(lambda: (c := control(server)).get("draft", {}).get("reloads", 0) >= 1
                  and c["draft"]["state"] == "healthy" and c, 60, "the draft to be reloaded and healthy")
    assert st["speculation"] == "on"
    stop.set()
    traffic.join(60)
    assert len(latencies) > 10 and max(latencies) < 2.5, f"target-only requests held up: max {max(latencies):.2f}s"
    r = generate_grpc(grpc, PROMPTS[3], GenerateParams(max_tokens=40))
    resumed_s = time.monotonic() - killed_at
    assert r.num_draft_tokens > 0 and r.output_ids == reference(PROMPTS[3], 40).token_ids
    assert resumed_s < RESUME_GOAL_S, f"speculation resumed {resumed_s:.1f}s after the kill"
    (new,) = stubs.stub_pids(server.pid)["draft"]
    assert new != old and not stubs.alive(old)
    assert st["draft"]["last_outage"]["downtime_s"] < RESUME_GOAL_S


def test_killing_the_draft_under_streams_in_flight_loses_no_token(server, reference):
    grpc = server.endpoints.grpc
    wait_for(lambda: control(server).get("speculation") == "on", 60, "speculation on")
    started = [threading.Event() for _ in range(4)]
    results: dict[int, object] = {}

    def one(i: int) -> None:
        try:
            results[i] = generate_grpc(grpc, PROMPTS[i], GenerateParams(max_tokens=150),
                                       on_text=lambda _t, i=i: started[i].set(), timeout_s=120)
        except Exception as e:  # recorded, asserted below
            results[i] = e
            started[i].set()

    threads = [threading.Thread(target=one, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for e in started:
        assert e.wait(60)
    stubs.kill_stub_asleep(server.pid, "draft")  # while all four stream, inside a forward pass
    for t in threads:
        t.join(120)
    for i in range(4):
        r = results[i]
        assert not isinstance(r, Exception), r
        assert r.output_ids == reference(PROMPTS[i], 150).token_ids, f"stream {i} differs"
    wait_for(lambda: control(server).get("speculation") == "on", 60, "speculation to resume")


def test_killing_the_target_fails_fast_never_hangs_and_recovers(server, reference):
    grpc = server.endpoints.grpc
    wait_for(lambda: control(server).get("target", {}).get("state") == "healthy", 30, "a healthy target")
    reloads = control(server)["target"]["reloads"]
    stubs.kill_stub(server.pid, "target")
    errors = []
    for p in PROMPTS[:3]:
        t0 = time.monotonic()
        try:
            r = generate_grpc(grpc, p, GenerateParams(max_tokens=20), timeout_s=60)
            assert r.output_ids == reference(p, 20).token_ids  # already back: then it must be right
        except ClientError as e:
            errors.append(e.message)
            assert "\n" not in e.message and "internal error" not in e.message
            assert "model 'target'" in e.message  # "... failed: Stub process ... not healthy" / "... is unavailable"
        assert time.monotonic() - t0 < 15, "a request hung on the dead target"
    assert errors, "no request noticed the dead target"
    wait_for(lambda: control(server).get("target", {}).get("reloads", 0) > reloads
             and control(server)["target"]["state"] == "healthy", 60, "the target to be reloaded")
    r = generate_grpc(grpc, PROMPTS[4], GenerateParams(max_tokens=30))
    assert r.output_ids == reference(PROMPTS[4], 30).token_ids
