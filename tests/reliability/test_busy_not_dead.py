"""A model busy with a long prefill is not a dead one (real tritonserver, tiny long-context pair).

The probe timeout and the liveness interval are made small (0.3 s) rather than the prompt huge:
the long prompt's prefill is fed as one call (``prefill_chunk_tokens`` 0) and takes longer than
both. Before, the liveness probe queued behind it, timed out, and the supervisor reloaded the
target under both requests.
"""

from __future__ import annotations

import threading
import time

import pytest

from reliability_helpers import LONG_PROMPT, STATIC_POLICY, control, long_context_pair, own_server, wait_for

from trtspec.serving import stubs
from trtspec.serving.client import GenerateParams, generate_grpc

PROBE_S = 0.3


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("busy")
    target, draft = long_context_pair(root / "models")
    spec = {"probe_timeout_s": PROBE_S, "health_interval_s": PROBE_S, "prefill_chunk_tokens": 0}
    with own_server(root, target, draft, policy=STATIC_POLICY, spec_decode=spec) as s:
        yield s


def test_a_long_prefill_beside_a_short_request_answers_both_without_a_reload(server):
    grpc = server.endpoints.grpc
    wait_for(lambda: control(server).get("target", {}).get("state") == "healthy", 30, "a healthy target")
    results: dict[str, object] = {}

    def send(name: str, prompt: str, n: int) -> None:
        t0 = time.monotonic()
        try:
            results[name] = generate_grpc(grpc, prompt, GenerateParams(max_tokens=n), timeout_s=120)
        except Exception as e:  # recorded, asserted below
            results[name] = e
        results[f"{name}_s"] = time.monotonic() - t0

    long = threading.Thread(target=send, args=("long", LONG_PROMPT, 8))
    long.start()
    time.sleep(0.2)  # the long prefill is running
    send("short", "Hello world", 8)
    long.join(120)
    assert not isinstance(results["long"], Exception), results["long"]
    assert not isinstance(results["short"], Exception), results["short"]
    assert results["long"].num_input_tokens > 3000 and results["long"].num_output_tokens == 8
    assert results["short"].num_output_tokens == 8
    assert results["long_s"] > 2 * PROBE_S  # the prefill did outlast the probe timeout
    st = control(server)
    for model in ("target", "draft"):
        assert st[model]["reloads"] == 0 and st[model]["probe_failures"] == 0, st[model]
        assert st[model]["outages"] == 0
    log = server.log_file.read_text()
    assert "-> failed" not in log and "-> reloading" not in log


def test_a_killed_target_stub_is_still_detected_in_the_usual_time(server):
    grpc = server.endpoints.grpc
    wait_for(lambda: control(server).get("target", {}).get("state") == "healthy", 30, "a healthy target")
    reloads = control(server)["target"]["reloads"]
    killed_at = time.monotonic()
    stubs.kill_stub(server.pid, "target")
    wait_for(lambda: control(server).get("target", {}).get("state") != "healthy", 30, "the dead target noticed")
    detected_s = time.monotonic() - killed_at
    assert detected_s < 5, f"a dead target was noticed only {detected_s:.1f}s after the kill"
    wait_for(lambda: control(server).get("target", {}).get("reloads", 0) > reloads, 60, "the target's reload")
    wait_for(lambda: control(server)["target"]["state"] == "healthy", 60, "the target healthy again")
    assert generate_grpc(grpc, "Hello world", GenerateParams(max_tokens=4)).num_output_tokens == 4
