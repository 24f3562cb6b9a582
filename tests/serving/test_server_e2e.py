"""End to end: a real tritonserver on the tiny repository, real tritonclient/HTTP calls."""

from __future__ import annotations

import re
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from trtspec.serving.client import (
    ClientError,
    GenerateParams,
    generate_grpc,
    generate_http,
    grpc_inputs,
    stream_infer,
)

MAX_TOKENS_LIMIT = 200  # as tiny_repo in conftest.py

PROMPTS = (
    "The quick brown fox",
    "Speculative decoding drafts tokens",
    "Triton Inference Server serves models",
    "Hello world! How are you",
    "Numbers 0 1 2 3",
    "def f(x): return",
    "The cat sat on",
    "I am fine, thank",
    "over HTTP and gRPC",
    "with a small model",
)


def metric(server, name: str, **labels: str) -> float:
    """One sample of the server's Prometheus metrics (0 if absent)."""
    text = urllib.request.urlopen(server.endpoints.metrics_url, timeout=10).read().decode()
    for line in text.splitlines():
        m = re.match(rf"^{name}\{{(.*)\}} (\S+)$", line)
        if m and all(f'{k}="{v}"' in m.group(1) for k, v in labels.items()):
            return float(m.group(2))
    return 0.0


def test_grpc_streaming_greedy_equals_the_target_alone(triton, reference):
    chunks: list[str] = []
    r = generate_grpc(triton.endpoints.grpc, PROMPTS[0], GenerateParams(max_tokens=48), on_text=chunks.append)
    ref = reference(PROMPTS[0], 48)
    assert r.output_ids == ref.token_ids  # token for token
    assert r.text == ref.text == "".join(chunks) and len(chunks) > 1
    assert r.finish_reason == ref.finish_reason.value and r.num_output_tokens == len(ref.token_ids)
    assert r.num_draft_tokens > 0 and r.acceptance_rate == pytest.approx(r.num_accepted_tokens / r.num_draft_tokens)
    assert r.acceptance_rate > 0.5  # the tiny draft is the target plus 1% noise
    assert r.ttft_s is not None and 0 < r.ttft_s <= r.total_s


def test_http_generate_and_generate_stream_equal_the_target_alone(triton, reference):
    ref = reference(PROMPTS[1], 40)
    whole = generate_http(triton.endpoints.http, PROMPTS[1], GenerateParams(max_tokens=40), stream=False)
    streamed = generate_http(triton.endpoints.http, PROMPTS[1], GenerateParams(max_tokens=40), stream=True)
    for r in (whole, streamed):
        assert r.output_ids == ref.token_ids and r.text == ref.text and r.finish_reason == ref.finish_reason.value
        assert r.num_draft_tokens > 0
    assert len(whole.chunks) == 1 and len(streamed.chunks) > 1


def test_speculation_off_runs_the_target_alone(triton, reference):
    r = generate_grpc(triton.endpoints.grpc, PROMPTS[2], GenerateParams(max_tokens=30, speculation="off"))
    assert r.output_ids == reference(PROMPTS[2], 30).token_ids and r.num_draft_tokens == 0
    assert r.acceptance_rate is None


@pytest.mark.parametrize("drafter", ["ngram", "suffix", "auto"])
def test_every_drafter_is_served_and_greedy_output_is_the_targets(triton, reference, drafter):
    """The ``drafter`` input through real Triton, gRPC and HTTP: same tokens as the target alone;
    the server counts drafted tokens under that drafter."""
    ref = reference(PROMPTS[3], 24)
    r = generate_grpc(triton.endpoints.grpc, PROMPTS[3], GenerateParams(max_tokens=24, drafter=drafter))
    h = generate_http(triton.endpoints.http, PROMPTS[3], GenerateParams(max_tokens=24, drafter=drafter), stream=False)
    assert r.output_ids == ref.token_ids and h.output_ids == ref.token_ids
    text = urllib.request.urlopen(triton.endpoints.metrics_url, timeout=10).read().decode()
    assert re.search(r'trtspec_drafted_tokens_total\{[^}]*drafter="ngram"', text)  # labelled by drafter


def test_ten_concurrent_streams_each_equal_the_target_alone(triton, reference):
    started = threading.Barrier(len(PROMPTS))

    def one(i: int):
        started.wait(30)  # all requests in flight together
        http = i % 3 == 2
        p = GenerateParams(max_tokens=60 + 5 * i)
        if http:
            return generate_http(triton.endpoints.http, PROMPTS[i], p, stream=True)
        return generate_grpc(triton.endpoints.grpc, PROMPTS[i], p)

    with ThreadPoolExecutor(len(PROMPTS)) as pool:
        results = list(pool.map(one, range(len(PROMPTS))))
    for i, r in enumerate(results):
        ref = reference(PROMPTS[i], 60 + 5 * i)
        assert r.output_ids == ref.token_ids, f"stream {i} differs"
        assert r.text == ref.text


def _bad_grpc(triton, values=None, inputs=None):
    with pytest.raises(ClientError) as e:
        stream_infer(triton.endpoints.grpc, "spec_decode", inputs if inputs is not None else grpc_inputs(values))
    return e.value.message


def test_every_bad_input_gets_a_clear_error_while_other_requests_succeed(triton, reference):
    import tritonclient.grpc as grpcclient

    wrong_type = grpc_inputs({"text_input": "hi"})
    t = grpcclient.InferInput("max_tokens", [1, 1], "FP32")
    t.set_data_from_numpy(np.array([[5.0]], dtype=np.float32))
    wrong_type.append(t)
    bad = {
        "missing text_input": (lambda: _bad_grpc(triton, {"max_tokens": 5}), "missing required input(s) ['text_input']"),
        "max_tokens 0": (lambda: _bad_grpc(triton, {"text_input": "hi", "max_tokens": 0}), "max_tokens must be > 0, got 0"),
        "max_tokens -5": (lambda: _bad_grpc(triton, {"text_input": "hi", "max_tokens": -5}), "max_tokens must be > 0, got -5"),
        "above the limit": (
            lambda: _bad_grpc(triton, {"text_input": "hi", "max_tokens": MAX_TOKENS_LIMIT + 1}),
            f"max_tokens must be <= {MAX_TOKENS_LIMIT} (this server's limit), got {MAX_TOKENS_LIMIT + 1}",
        ),
        "wrong type": (lambda: _bad_grpc(triton, inputs=wrong_type), "input 'max_tokens' data-type is 'FP32', but model 'spec_decode' expects 'INT32'"),
        "unknown speculation": (
            lambda: _bad_grpc(triton, {"text_input": "hi", "max_tokens": 5, "speculation": "sometimes"}),
            "speculation must be one of auto, on, off; got 'sometimes'",
        ),
        "over-long prompt": (
            lambda: _bad_grpc(triton, {"text_input": "Hello world! " * 200, "max_tokens": 5}),
            "the context window holds 256, leaving no room to generate",
        ),
        "http max_tokens -1": (lambda: _http_error(triton, {"text_input": "hi", "max_tokens": -1}), "max_tokens must be > 0, got -1"),
        "http wrong type": (lambda: _http_error(triton, {"text_input": "hi", "max_tokens": "ten"}), "Unable to parse 'data'"),
    }
    good = {i: PROMPTS[i] for i in (3, 4, 5)}
    with ThreadPoolExecutor(len(bad) + len(good)) as pool:
        bad_futures = {name: pool.submit(fn) for name, (fn, _) in bad.items()}
        good_futures = {i: pool.submit(generate_grpc, triton.endpoints.grpc, p, GenerateParams(max_tokens=50)) for i, p in good.items()}
        for name, (_, expected) in bad.items():
            message = bad_futures[name].result()
            assert expected in message, name
            assert "\n" not in message and "Traceback" not in message, name
        for i, fut in good_futures.items():
            assert fut.result().output_ids == reference(good[i], 50).token_ids
    assert triton.alive()
    r = generate_grpc(triton.endpoints.grpc, PROMPTS[6], GenerateParams(max_tokens=10))
    assert r.output_ids == reference(PROMPTS[6], 10).token_ids


def _http_error(triton, body):
    import json

    req = urllib.request.Request(
        f"http://{triton.endpoints.http}/v2/models/spec_decode/generate", data=json.dumps(body).encode(), method="POST"
    )
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=30)
    assert e.value.code in (400, 500)
    return json.loads(e.value.read())["error"]


def test_client_cancellation_stops_the_loop(triton):
    before = metric(triton, "trtspec_requests_total", outcome="cancelled")
    emitted_before = metric(triton, "trtspec_emitted_tokens_total")
    cancel = threading.Event()
    chunks: list[str] = []

    def on_text(text: str) -> None:
        chunks.append(text)
        cancel.set()  # the client gives up after the first piece of text

    long = GenerateParams(max_tokens=MAX_TOKENS_LIMIT, speculation="off")  # one token per response: many responses
    r = generate_grpc(triton.endpoints.grpc, PROMPTS[7], long, on_text=on_text, cancel=cancel)
    assert r.finish_reason == "cancelled" and chunks
    deadline = time.monotonic() + 60
    while metric(triton, "trtspec_requests_total", outcome="cancelled") < before + 1:  # the server notices
        assert time.monotonic() < deadline, "the server never saw the cancellation"
        time.sleep(0.1)
    emitted = metric(triton, "trtspec_emitted_tokens_total") - emitted_before
    assert 0 < emitted < MAX_TOKENS_LIMIT  # the loop stopped early
    ok = generate_grpc(triton.endpoints.grpc, PROMPTS[8], GenerateParams(max_tokens=5))
    assert ok.num_output_tokens == 5
