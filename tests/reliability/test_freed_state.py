"""Client cancellations and disconnects mid-stream free their state (shared ``triton``): afterwards
the draft and target hold no KV-cache session and spec_decode no request."""

from __future__ import annotations

import http.client
import json
import threading

from reliability_helpers import MAX_TOKENS_LIMIT, PROMPTS, control, metric, model_status, wait_for

from trtspec.serving.client import GenerateParams, generate_grpc


def _sessions(triton) -> tuple:
    return (model_status(triton, "draft").get("sessions"), model_status(triton, "target").get("sessions"),
            control(triton).get("requests", {}).get("in_flight"))


def test_cancelled_and_disconnected_streams_free_their_sessions(triton, reference):
    wait_for(lambda: _sessions(triton) == (0, 0, 0), 30, "an idle server")
    cancelled_before = metric(triton, "trtspec_requests_total", outcome="cancelled")
    started = threading.Barrier(7)
    grpc_results: list = []
    http_events: list = []

    def grpc_cancel(i: int) -> None:
        cancel = threading.Event()

        def on_text(_text: str) -> None:
            cancel.set()  # the client gives up after the first piece of text

        started.wait(30)
        grpc_results.append(generate_grpc(triton.endpoints.grpc, PROMPTS[i], GenerateParams(max_tokens=MAX_TOKENS_LIMIT),
                                     on_text=on_text, cancel=cancel, timeout_s=120))

    def http_disconnect(i: int) -> None:
        host, port = triton.endpoints.http.split(":")
        conn = http.client.HTTPConnection(host, int(port), timeout=60)
        body = json.dumps({"text_input": PROMPTS[i], "max_tokens": MAX_TOKENS_LIMIT, "stream": True})
        started.wait(30)
        conn.request("POST", "/v2/models/spec_decode/generate_stream", body=body)
        resp = conn.getresponse()
        first = resp.readline()  # one server-sent event, then hang up mid-stream
        http_events.append(first)
        conn.sock.close()
        conn.close()

    threads = [threading.Thread(target=grpc_cancel, args=(i,)) for i in range(4)]
    threads += [threading.Thread(target=http_disconnect, args=(i,)) for i in range(4, 6)]
    for t in threads:
        t.start()
    started.wait(30)
    for t in threads:
        t.join(120)
    assert len(grpc_results) == 4 and all(r.finish_reason == "cancelled" for r in grpc_results)
    assert len(http_events) == 2 and all(e.startswith(b"data:") for e in http_events)
    # every session released, nothing in flight: polled, the releases are asynchronous
    wait_for(lambda: _sessions(triton) == (0, 0, 0), 60, "the sessions to be freed")
    assert model_status(triton, "draft")["cache_bytes"] == 0 and model_status(triton, "target")["cache_bytes"] == 0
    assert metric(triton, "trtspec_requests_total", outcome="cancelled") >= cancelled_before + 4
    r = generate_grpc(triton.endpoints.grpc, PROMPTS[0], GenerateParams(max_tokens=20))
    assert r.output_ids == reference(PROMPTS[0], 20).token_ids
    wait_for(lambda: _sessions(triton) == (0, 0, 0), 30, "the last request's sessions to be freed")
