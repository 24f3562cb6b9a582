"""The OpenAI-compatible endpoint end to end: a real tritonserver on the tiny pair (its tokenizer
given a ChatML chat template), the proxy in front of it, the official ``openai`` SDK as the client."""

from __future__ import annotations

import json
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trtspec.builder.repo import write_model_repo
from trtspec.decoding.types import Penalties
from trtspec.serving import statusfile
from trtspec.serving.client import GenerateParams, generate_http
from trtspec.serving.launcher import ServerError, TritonServer, find_tritonserver, free_port
from trtspec.serving.openai_api.app import ProxySettings
from trtspec.serving.openai_api.server import OpenAIServer
from trtspec.testing.tiny import EOS_PROMPTS, with_chat_template

PROMPT = "The quick brown fox"
MAX_TOKENS_LIMIT = 200


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, tiny_target: Path, tiny_draft: Path,
           static_policy: Path) -> Iterator[tuple[TritonServer, OpenAIServer]]:
    """tritonserver on the tiny pair with a chat template (spec_decode applies it: the default), and the proxy."""
    try:
        install = find_tritonserver()
    except ServerError as e:
        pytest.skip(str(e))
    root = tmp_path_factory.mktemp("openai")
    tokenizer = with_chat_template(tiny_target, root / "tokenizer")
    repo = write_model_repo(root / "model_repo", target_checkpoint=tiny_target, draft_checkpoint=tiny_draft,
                            tokenizer_dir=tokenizer, max_tokens_limit=MAX_TOKENS_LIMIT, max_concurrency=8,
                            policy_file=static_policy)
    with TritonServer(repo, log_file=root / "tritonserver.log", install=install) as triton:
        proxy = OpenAIServer(triton.endpoints.grpc).start()
        try:
            yield triton, proxy
        finally:
            proxy.stop()


@pytest.fixture(scope="module")
def client(served) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{served[1].url}/v1", api_key="unused", max_retries=0, timeout=60)


def triton_generate(triton: TritonServer, prompt: str, max_tokens: int, templated: bool) -> str:
    params = GenerateParams(max_tokens=max_tokens, temperature=0.0, apply_chat_template=templated)
    return generate_http(triton.endpoints.http, prompt, params).text


def test_models_lists_the_served_model_and_retrieves_it(client):
    assert [m.id for m in client.models.list()] == ["spec_decode"]
    assert client.models.retrieve("spec_decode").id == "spec_decode"
    with pytest.raises(openai.NotFoundError) as info:
        client.models.retrieve("gpt-4o")
    assert info.value.body["code"] == "model_not_found" and "'gpt-4o' does not exist" in info.value.message


def test_chat_greedy_equals_tritons_generate_with_the_template_applied_once(served, client):
    r = client.chat.completions.create(model="spec_decode", messages=[{"role": "user", "content": PROMPT}],
                                       max_tokens=24, temperature=0)
    # spec_decode templates text_input itself (apply_chat_template is on): the same prompt, templated once
    expected = triton_generate(served[0], PROMPT, 24, templated=True)
    assert r.choices[0].message.content == expected and expected
    assert r.choices[0].message.role == "assistant" and r.object == "chat.completion"
    assert r.choices[0].finish_reason in ("length", "stop")
    assert r.usage.completion_tokens <= 24 and r.usage.prompt_tokens > len(PROMPT.split())  # the template's tokens
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    ext = r.model_extra["trtspec"]  # the request's acceptance figures (extension)
    assert ext["num_draft_tokens"] > 0 and 0 <= ext["num_accepted_tokens"] <= ext["num_draft_tokens"]
    assert ext["acceptance_rate"] == pytest.approx(ext["num_accepted_tokens"] / ext["num_draft_tokens"])


def test_chat_streaming_with_usage_in_the_last_chunk(served, client):
    stream = client.chat.completions.create(
        model="spec_decode", messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": PROMPT}],
        max_completion_tokens=30, temperature=0, stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    whole = client.chat.completions.create(
        model="spec_decode", messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": PROMPT}],
        max_completion_tokens=30, temperature=0)
    assert text == whole.choices[0].message.content and len([c for c in chunks if c.choices]) > 2
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-2].choices[0].finish_reason == whole.choices[0].finish_reason
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    assert all(c.usage is None for c in chunks[:-1])


def test_completions_streamed_and_not_equal_tritons_generate_untemplated(served, client):
    expected = triton_generate(served[0], PROMPT, 20, templated=False)
    r = client.completions.create(model="spec_decode", prompt=PROMPT, max_tokens=20, temperature=0)
    assert r.choices[0].text == expected and r.object == "text_completion"
    pieces = [c.choices[0].text for c in client.completions.create(
        model="spec_decode", prompt=PROMPT, max_tokens=20, temperature=0, stream=True)]
    assert "".join(pieces) == expected and len(pieces) > 2


@pytest.mark.parametrize("prompt", [PROMPT, [PROMPT]])
def test_completions_echo_opens_the_text_with_the_prompt(client, prompt):
    answer = client.completions.create(model="spec_decode", prompt=PROMPT, max_tokens=12, temperature=0)
    echoed = client.completions.create(model="spec_decode", prompt=prompt, max_tokens=12, temperature=0, echo=True)
    assert echoed.choices[0].text == PROMPT + answer.choices[0].text
    assert echoed.usage == answer.usage  # the echo is not generated: no tokens counted for it
    chunks = list(client.completions.create(model="spec_decode", prompt=prompt, max_tokens=12, temperature=0,
                                            echo=True, stream=True))
    assert chunks[0].choices[0].text.startswith(PROMPT)  # the prompt first, with the first text
    assert "".join(c.choices[0].text for c in chunks) == PROMPT + answer.choices[0].text


def test_bad_words_are_spec_decodes_and_change_the_answer(served, client, tiny_target):
    """vLLM's bad_words, forwarded: the answer is Triton's generate with the same bad_words."""
    from trtspec.runtime.tokenizer import Tokenizer

    http, tok = served[0].endpoints.http, Tokenizer.from_dir(tiny_target)
    plain = generate_http(http, PROMPT, GenerateParams(max_tokens=20, temperature=0.0, apply_chat_template=False))
    word = next(w for t in plain.output_ids[2:] if (w := tok.decode([t])).strip() and tok.encode_words([w]) == ((t,),))
    params = GenerateParams(max_tokens=20, temperature=0.0, apply_chat_template=False, bad_words=[word])
    expected = generate_http(http, PROMPT, params).text
    r = client.completions.create(model="spec_decode", prompt=PROMPT, max_tokens=20, temperature=0,
                                  extra_body={"bad_words": [word]})
    assert r.choices[0].text == expected != plain.text


@pytest.mark.parametrize("stream", [False, True])
def test_penalties_are_spec_decodes_and_change_the_answer(served, client, stream):
    """OpenAI's presence and frequency penalties and vLLM's repetition_penalty, forwarded: the answer is
    Triton's generate with the same penalties (spec_decode's meaning, the prompt counted)."""
    http = served[0].endpoints.http
    plain = generate_http(http, PROMPT, GenerateParams(max_tokens=20, temperature=0.0, apply_chat_template=False))
    pen = Penalties(repetition=0.5, presence=-1.0, frequency=0.25)  # below 1 and 0: repeat (this answer never does)
    params = GenerateParams(max_tokens=20, temperature=0.0, apply_chat_template=False, penalties=pen)
    expected = generate_http(http, PROMPT, params).text
    r = client.completions.create(model="spec_decode", prompt=PROMPT, max_tokens=20, temperature=0, stream=stream,
                                  presence_penalty=-1.0, frequency_penalty=0.25, extra_body={"repetition_penalty": 0.5})
    text = "".join(c.choices[0].text for c in r) if stream else r.choices[0].text
    assert text == expected != plain.text


@pytest.mark.parametrize("stream", [False, True])
def test_logit_bias_is_spec_decodes_and_changes_the_answer(served, client, stream):
    """OpenAI's logit_bias (token id -> -100..100), forwarded: -100 on a token of the plain answer keeps it out,
    and the answer is Triton's generate with the same bias."""
    from trtspec.decoding import LogitBias

    http = served[0].endpoints.http
    plain = generate_http(http, PROMPT, GenerateParams(max_tokens=20, temperature=0.0, apply_chat_template=False))
    banned = plain.output_ids[3]
    params = GenerateParams(max_tokens=20, temperature=0.0, apply_chat_template=False,
                            logit_bias=LogitBias.of([(banned, -100.0)]))
    expected = generate_http(http, PROMPT, params)
    r = client.completions.create(model="spec_decode", prompt=PROMPT, max_tokens=20, temperature=0, stream=stream,
                                  logit_bias={str(banned): -100})
    text = "".join(c.choices[0].text for c in r) if stream else r.choices[0].text
    assert text == expected.text != plain.text and banned not in expected.output_ids


def _target_logprobs(http: str, prompt: str, max_tokens: int, templated: bool, top: int):
    """Triton's generate endpoint asked for return_log_probs and top_logprobs: the token ids, their
    log-probabilities and each position's ``top`` most likely tokens."""
    params = GenerateParams(max_tokens=max_tokens, temperature=0.0, apply_chat_template=templated, logprobs=True,
                            top_logprobs=top)
    r = generate_http(http, prompt, params)
    assert r.logprobs is not None and len(r.logprobs) == len(r.output_ids) == len(r.top_logprobs or r.output_ids) > 0
    return r.output_ids, r.logprobs, r.top_logprobs


@pytest.mark.parametrize("stream", [False, True])
def test_chat_logprobs_are_spec_decodes_with_each_tokens_text(served, client, tiny_target, stream):
    from trtspec.runtime.tokenizer import Tokenizer

    ids, expected, top = _target_logprobs(served[0].endpoints.http, PROMPT, 20, templated=True, top=3)
    r = client.chat.completions.create(model="spec_decode", messages=[{"role": "user", "content": PROMPT}],
                                       max_tokens=20, temperature=0, logprobs=True, top_logprobs=3, stream=stream)
    content = [e for c in r if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content] \
        if stream else r.choices[0].logprobs.content
    tok = Tokenizer.from_dir(tiny_target)
    assert [e.token for e in content] == tok.token_texts(ids)
    assert [e.logprob for e in content] == pytest.approx(expected, abs=1e-6)
    assert all(e.bytes == list(e.token.encode()) for e in content)
    assert [[a.token for a in e.top_logprobs] for e in content] == [tok.token_texts([i for i, _ in row]) for row in top]
    assert [a.logprob for e in content for a in e.top_logprobs] == pytest.approx([x for row in top for _, x in row], abs=1e-6)
    assert all(e.top_logprobs[0].token == e.token for e in content)  # greedy: the chosen token is the best
    plain = client.chat.completions.create(model="spec_decode", messages=[{"role": "user", "content": PROMPT}],
                                           max_tokens=4, temperature=0, logprobs=True)
    assert all(e.top_logprobs == [] for e in plain.choices[0].logprobs.content)


@pytest.mark.parametrize("stream", [False, True])
def test_completions_logprobs_are_the_chosen_tokens_and_the_best(served, client, tiny_target, stream):
    from trtspec.runtime.tokenizer import Tokenizer

    ids, expected, top = _target_logprobs(served[0].endpoints.http, PROMPT, 16, templated=False, top=2)
    r = client.completions.create(model="spec_decode", prompt=PROMPT, max_tokens=16, temperature=0, logprobs=2,
                                  stream=stream)
    choices = [c.choices[0] for c in r] if stream else r.choices
    tokens = [t for c in choices if c.logprobs for t in c.logprobs.tokens]
    logprobs = [x for c in choices if c.logprobs for x in c.logprobs.token_logprobs]
    offsets = [x for c in choices if c.logprobs for x in c.logprobs.text_offset]
    best = [d for c in choices if c.logprobs for d in c.logprobs.top_logprobs]
    tok = Tokenizer.from_dir(tiny_target)
    assert tokens == tok.token_texts(ids) and logprobs == pytest.approx(expected, abs=1e-6)
    assert offsets == [sum(len(t) for t in tokens[:i]) for i in range(len(tokens))]
    texts = [dict.fromkeys(tok.token_texts([i for i, _ in row])) for row in top]  # one entry per text, best first
    assert [list(d) for d in best] == [list(t) for t in texts]
    assert all(d[t] == pytest.approx(x, abs=1e-6) for d, t, x in zip(best, tokens, logprobs))  # greedy: the best
    zero = client.completions.create(model="spec_decode", prompt=PROMPT, max_tokens=4, temperature=0, logprobs=0)
    assert zero.choices[0].logprobs.top_logprobs is None and len(zero.choices[0].logprobs.tokens) == 4
    plain = client.completions.create(model="spec_decode", prompt=PROMPT, max_tokens=4, temperature=0)
    assert plain.choices[0].logprobs is None


def test_stream_ends_with_done_over_raw_http(served):
    body = json.dumps({"model": "spec_decode", "prompt": PROMPT, "max_tokens": 8, "stream": True}).encode()
    req = urllib.request.Request(f"{served[1].url}/v1/completions", data=body,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as resp:
        events = [line for line in resp.read().decode().splitlines() if line.startswith("data:")]
    assert events[-1] == "data: [DONE]" and resp.headers["Content-Type"].startswith("text/event-stream")


def test_seeded_sampling_repeats_and_speculation_can_be_switched_off(client):
    def sample(**extra):
        return client.completions.create(model="spec_decode", prompt=PROMPT, max_tokens=16, temperature=1.0,
                                         top_p=0.9, seed=7, **extra)

    a, b = sample(), sample()
    assert a.choices[0].text == b.choices[0].text
    off = sample(extra_body={"speculation": "off"})
    assert off.model_extra["trtspec"]["num_draft_tokens"] == 0 and off.model_extra["trtspec"]["acceptance_rate"] is None


def test_stop_string_ends_the_text(client):
    full = client.completions.create(model="spec_decode", prompt=PROMPT, max_tokens=30, temperature=0).choices[0].text
    stop = full[len(full) // 2:][:3]  # a piece of what the model says without it
    r = client.completions.create(model="spec_decode", prompt=PROMPT, max_tokens=30, temperature=0, stop=stop)
    assert len(stop) == 3 and stop not in r.choices[0].text and full.startswith(r.choices[0].text)
    assert r.choices[0].finish_reason == "stop"


@pytest.mark.parametrize("stream", [False, True])
def test_ignore_eos_and_min_tokens_run_the_answer_past_eos(client, stream):
    """vLLM's ``ignore_eos`` (sent by ``vllm bench serve --ignore-eos``): EOS does not end the answer;
    ``min_tokens``: no EOS among the first tokens."""
    def complete(prompt: str, **extra) -> tuple[str, str | None, int]:
        args = dict(model="spec_decode", prompt=prompt, max_tokens=30, temperature=0, **extra)
        if not stream:
            r = client.completions.create(**args)
            return r.choices[0].text, r.choices[0].finish_reason, r.usage.completion_tokens
        chunks = list(client.completions.create(**args, stream=True, stream_options={"include_usage": True}))
        text = "".join(c.choices[0].text for c in chunks if c.choices)
        finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
        return text, finish[-1], chunks[-1].usage.completion_tokens

    prompt = next((p for p in EOS_PROMPTS if complete(p)[1] == "stop"), None)
    assert prompt is not None  # the precondition: an answer that EOS ends
    text, _, tokens = complete(prompt)
    assert tokens < 20
    long_text, long_finish, long_tokens = complete(prompt, extra_body={"ignore_eos": True})
    assert long_finish == "length" and long_tokens == 30
    assert long_text.startswith(text) and len(long_text) > len(text)  # greedy: the same answer, then more
    held_text, held_finish, held_tokens = complete(prompt, extra_body={"min_tokens": 20})  # vLLM's: no EOS before 20
    assert held_tokens >= 20 and held_text.startswith(text) and len(held_text) > len(text)
    off = complete(prompt, extra_body={"min_tokens": 20, "speculation": "off"})
    assert off == (held_text, held_finish, held_tokens)  # speculation on and off: the same answer


@pytest.mark.parametrize(("kwargs", "status", "says"), [
    (dict(n=2), 400, "n 2"),
    (dict(max_tokens=MAX_TOKENS_LIMIT + 1), 400, "max_tokens must be <= 200"),  # spec_decode's own check
    (dict(temperature=5), 400, "temperature"),
    (dict(model="gpt-4o"), 404, "'gpt-4o' does not exist"),
    (dict(extra_body={"speculation": "maybe"}), 400, "speculation"),
    (dict(presence_penalty=2.5), 400, "presence_penalty"),  # OpenAI's range: -2..2
    (dict(extra_body={"min_tokens": 8}), 400, "min_tokens must be >= 0 and <= max_tokens (4), got 8"),
    (dict(extra_body={"repetition_penalty": 0}), 400, "repetition_penalty"),
    (dict(logprobs=6), 400, "logprobs"),  # OpenAI's range: 0..5
    (dict(logit_bias={"1000000": 5}), 400, "logit bias: token id 1000000 is not in the vocabulary"),
    (dict(max_tokens=10**12), 400, "max_tokens 1000000000000 is out of range"),  # was wrapped to an int32
])
def test_bad_requests_get_openais_error_json(client, kwargs, status, says):
    args = {"model": "spec_decode", "prompt": PROMPT, "max_tokens": 4, **kwargs}
    with pytest.raises(openai.APIStatusError) as info:
        client.completions.create(**args)
    assert info.value.status_code == status and says in info.value.message
    assert info.value.body["type"] == "invalid_request_error"  # the SDK hands over the "error" object
    # and the server goes on serving
    assert client.completions.create(model="spec_decode", prompt=PROMPT, max_tokens=2, temperature=0).choices


def test_a_prompt_too_long_is_a_400_even_when_streaming(client):
    with pytest.raises(openai.BadRequestError) as info:
        list(client.completions.create(model="spec_decode", prompt="word " * 400, max_tokens=4, stream=True))
    assert "context window" in info.value.message


def _sessions(triton: TritonServer) -> tuple:
    assert triton.status_dir is not None
    read = lambda name: statusfile.read_status(triton.status_dir / f"{name}.json") or {}  # noqa: E731
    return (read("draft").get("sessions"), read("target").get("sessions"),
            read("spec_decode").get("requests", {}).get("in_flight"))


def _wait_idle(triton: TritonServer, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while _sessions(triton) != (0, 0, 0):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)  # polling the status files the models write
    return True


def _metric(triton: TritonServer, name: str, label: str) -> float:
    """The sum of ``name``'s samples on Triton's metrics port whose labels include ``label``."""
    text = urllib.request.urlopen(triton.endpoints.metrics_url, timeout=10).read().decode()
    return sum(float(x.rsplit(" ", 1)[1]) for x in text.splitlines() if x.startswith(name + "{") and label in x)


def _triton_cancelled(triton: TritonServer) -> float:
    return _metric(triton, "trtspec_requests_total", 'outcome="cancelled"')


def _target_calls(triton: TritonServer) -> float:
    """Calls the target has answered: Triton's own count, updated per call (not per interval)."""
    return _metric(triton, "nv_inference_request_success", 'model="target"')


def test_a_disconnect_mid_stream_cancels_the_request_and_frees_its_session(served, client):
    triton, proxy = served
    assert _wait_idle(triton, 30)
    cancelled_before = _triton_cancelled(triton)
    stream = client.chat.completions.create(model="spec_decode", messages=[{"role": "user", "content": PROMPT}],
                                            max_tokens=MAX_TOKENS_LIMIT, temperature=0, stream=True,
                                            extra_body={"speculation": "on"})
    first = next(iter(stream))
    assert first.choices[0].delta.role == "assistant"
    stream.close()  # hang up mid-stream
    # and a client that hangs up while waiting for a whole (not streamed) answer
    body = json.dumps({"model": "spec_decode", "prompt": PROMPT, "max_tokens": MAX_TOKENS_LIMIT, "temperature": 0})
    assert _wait_idle(triton, 30)
    target_calls = _target_calls(triton)
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as sock:
        sock.sendall(f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     f"Content-Length: {len(body)}\r\n\r\n{body}".encode())
        # hang up once spec_decode has called the target for it: the 200 tokens take ~0.4 s on a fast core,
        # so the status file (every 1 s) is too slow a sign; Triton counts calls per request
        deadline = time.monotonic() + 10
        while _target_calls(triton) == target_calls and time.monotonic() < deadline:
            time.sleep(0.005)
    assert _wait_idle(triton, 30), f"sessions left after the disconnects: {_sessions(triton)}"
    assert proxy.in_flight == 0
    assert _triton_cancelled(triton) == cancelled_before + 2  # spec_decode saw both requests cancelled
    metrics = urllib.request.urlopen(f"{proxy.url}/metrics", timeout=10).read().decode()
    assert 'trtspec_openai_requests_total{endpoint="/v1/chat/completions",outcome="cancelled"} 1.0' in metrics
    assert 'trtspec_openai_requests_total{endpoint="/v1/completions",outcome="cancelled"} 1.0' in metrics


def test_stop_lets_the_requests_in_flight_finish(served):
    triton = served[0]
    proxy = OpenAIServer(triton.endpoints.grpc).start()  # one of its own: this test stops it
    client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="unused", max_retries=0, timeout=60)
    stream = client.completions.create(model="spec_decode", prompt=PROMPT, max_tokens=40, temperature=0, stream=True)
    chunks = iter(stream)
    first = next(chunks)
    stopper = threading.Thread(target=proxy.stop, kwargs={"grace_s": 60})
    stopper.start()
    rest = [c.choices[0].text for c in chunks]
    stopper.join(30)
    assert not stopper.is_alive()
    assert first.choices[0].text + "".join(rest) == triton_generate(triton, PROMPT, 40, templated=False)
    with pytest.raises(openai.APIConnectionError):  # no longer accepting
        client.completions.create(model="spec_decode", prompt=PROMPT, max_tokens=2)


def test_health_and_metrics(served):
    proxy = served[1]
    with urllib.request.urlopen(f"{proxy.url}/health", timeout=10) as r:
        assert r.status == 200 and json.loads(r.read())["status"] == "ok"
    text = urllib.request.urlopen(f"{proxy.url}/metrics", timeout=10).read().decode()
    assert 'trtspec_openai_requests_total{endpoint="/v1/completions",outcome="ok"}' in text
    assert "trtspec_openai_time_to_first_token_seconds_bucket" in text
    assert 'trtspec_openai_request_duration_seconds_count{endpoint="/v1/completions"}' in text


def test_a_body_that_is_not_json_is_a_400_in_openais_error_json(served):
    request = urllib.request.Request(f"{served[1].url}/v1/completions", data=b'{"model": "spec_decode", "prompt"',
                                     headers={"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(request, timeout=30)
    error = json.loads(info.value.read())["error"]
    assert info.value.code == 400 and error["type"] == "invalid_request_error" and "\n" not in error["message"]


@pytest.mark.parametrize(("method", "path", "body", "content_type", "status", "says"), [
    ("POST", "/v1/embeddings", b"{}", "application/json", 404, "no such endpoint: POST /v1/embeddings"),
    ("GET", "/v1/completions", None, None, 405, "GET is not allowed on /v1/completions"),
    # curl -d without -H: a form body, which FastAPI does not read as JSON
    ("POST", "/v1/completions", b'{"model": "spec_decode", "prompt": "hi"}', "application/x-www-form-urlencoded",
     400, "the body must be a JSON object, sent with Content-Type: application/json"),
    ("POST", "/v1/completions", b"", "application/json", 400, "the body must be a JSON object"),
    ("POST", "/v1/chat/completions", b"[1, 2]", "application/json", 400, "the body must be a JSON object"),
    ("POST", "/v1/completions", b'{"model": "spec_decode",', "application/json", 400, "the body is not valid JSON"),
    # valid JSON (an escaped lone surrogate) that is no text: the SDK refuses to send it, raw HTTP can; was a 500
    ("POST", "/v1/completions", json.dumps({"model": "spec_decode", "prompt": "a \ud800", "max_tokens": 4}).encode(),
     "application/json", 400, "prompt is not valid text: surrogates not allowed (character 2)"),
    ("POST", "/v1/chat/completions", json.dumps({"model": "spec_decode", "stream": True, "max_tokens": 4,
                                                 "messages": [{"role": "user", "content": "\udfff"}]}).encode(),
     "application/json", 400, "messages.0.content is not valid text: surrogates not allowed (character 0)"),
])
def test_what_fastapi_or_the_schema_refuses_is_in_openais_error_json(served, method, path, body, content_type,
                                                                     status, says):
    headers = {"Content-Type": content_type} if content_type else {}
    request = urllib.request.Request(f"{served[1].url}{path}", data=body, headers=headers, method=method)
    label = {"endpoint": path if path.endswith("completions") else "other", "outcome": "invalid"}
    counted = _refused(served[1], label)
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(request, timeout=30)
    error = json.loads(info.value.read())["error"]  # not FastAPI's {"detail": ...}
    assert info.value.code == status and says in error["message"] and "\n" not in error["message"]
    assert error["type"] == "invalid_request_error"
    assert _refused(served[1], label) == counted + 1  # on the endpoint's /metrics, refused before its route too


def _refused(proxy: OpenAIServer, labels: dict) -> float:
    return proxy.metrics.registry.get_sample_value("trtspec_openai_requests_total", labels) or 0.0


TEXT = st.one_of(st.text(max_size=8), st.text(st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF), min_size=1,
                                                max_size=2), st.sampled_from(["", "auto", "off", "text", "x" * 70_000]))
NUMBER = st.one_of(st.integers(-2, 6), st.integers(-(2**70), 2**70), st.floats(allow_nan=True, allow_infinity=True))
ODD = st.one_of(
    st.none(), st.booleans(), NUMBER, TEXT, st.lists(st.one_of(st.integers(-2, 400), TEXT), max_size=3),
    st.dictionaries(st.sampled_from(["1", "-1", "x", "type", "include_usage"]), NUMBER, max_size=2),
)
NUMBERS = ["max_tokens", "max_completion_tokens", "temperature", "top_p", "seed", "n", "presence_penalty",
           "frequency_penalty", "top_logprobs", "top_k", "repetition_penalty", "min_tokens", "best_of", "logprobs"]
TEXTS = ["stop", "speculation", "priority", "drafter", "suffix", "model", "prompt", "bad_words"]
OTHERS = ["stream", "stream_options", "logit_bias", "ignore_eos", "tools", "response_format", "echo", "messages"]


@st.composite
def openai_body(draw):
    """A chat or completions body as a careless client sends it: a valid base, a few fields odd or absent
    (a number field mostly gets numbers, a text field text, any field sometimes anything)."""
    chat = draw(st.booleans())
    base = {"model": "spec_decode", "max_tokens": 4}
    base |= {"messages": [{"role": "user", "content": PROMPT}]} if chat else {"prompt": PROMPT}
    for name in draw(st.lists(st.sampled_from(NUMBERS + TEXTS + OTHERS), unique=True, max_size=4)):
        base[name] = draw(st.one_of(NUMBER if name in NUMBERS else TEXT if name in TEXTS else ODD, ODD))
    if chat and draw(st.booleans()):
        base["messages"] = [{"role": "user", "content": draw(TEXT)}]
    return ("/v1/chat/completions" if chat else "/v1/completions"), base


@settings(max_examples=300, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(request_=openai_body())
def test_fuzzed_openai_bodies_get_an_answer_or_a_one_line_error(served, request_):
    path, body = request_
    request = urllib.request.Request(f"{served[1].url}{path}", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            assert response.status == 200 and response.read()
    except urllib.error.HTTPError as e:
        error = json.loads(e.read())["error"]
        assert e.code in (400, 404), (e.code, error)  # never a 500: every odd value is the client's to fix
        assert error["message"] and "\n" not in error["message"] and len(error["message"]) < 300, error


def test_an_api_key_guards_v1_and_leaves_health_and_metrics_open(served):
    triton = served[0]
    with OpenAIServer(triton.endpoints.grpc, api_key="s3cret") as guarded:
        right = openai.OpenAI(base_url=f"{guarded.url}/v1", api_key="s3cret", max_retries=0, timeout=60)
        assert right.completions.create(model="spec_decode", prompt=PROMPT, max_tokens=2).usage.completion_tokens == 2
        assert [m.id for m in right.models.list()] == ["spec_decode"]
        wrong = openai.OpenAI(base_url=f"{guarded.url}/v1", api_key="guess", max_retries=0, timeout=60)
        with pytest.raises(openai.AuthenticationError) as info:
            wrong.chat.completions.create(model="spec_decode", messages=[{"role": "user", "content": "hi"}])
        assert info.value.status_code == 401 and info.value.body["code"] == "invalid_api_key"
        # no header at all, and a body that is no JSON: the key is asked first
        request = urllib.request.Request(f"{guarded.url}/v1/completions", data=b"{", method="POST",
                                         headers={"Content-Type": "application/json"})
        with pytest.raises(urllib.error.HTTPError) as bare:
            urllib.request.urlopen(request, timeout=30)
        assert bare.value.code == 401
        assert "Authorization: Bearer" in json.loads(bare.value.read())["error"]["message"]
        assert _refused(guarded, {"endpoint": "/v1/chat/completions", "outcome": "unauthorized"}) == 1
        assert _refused(guarded, {"endpoint": "/v1/completions", "outcome": "unauthorized"}) == 1
        for path in ("/health", "/metrics"):  # probes and scrapers hold no key
            assert urllib.request.urlopen(f"{guarded.url}{path}", timeout=30).status == 200


def test_health_is_503_while_triton_cannot_be_reached(tmp_path):
    """No tritonserver behind the endpoint (a free port): /health says so, it does not hang or 500."""
    settings = ProxySettings(triton_grpc=f"127.0.0.1:{free_port()}", model="spec_decode", served_name="spec_decode",
                             max_tokens_limit=16, tokenizer=None)
    with OpenAIServer(settings.triton_grpc, settings=settings) as proxy:
        with pytest.raises(urllib.error.HTTPError) as info:
            urllib.request.urlopen(f"{proxy.url}/health", timeout=30)
    assert info.value.code == 503 and json.loads(info.value.read()) == {"status": "unavailable", "model": "spec_decode"}


def test_bench_drives_the_openai_endpoint(served):
    from trtspec.bench import ArmSplit, BenchConfig, OutputLength, builtin_prompts, run_bench

    cfg = BenchConfig(url=served[1].url, protocol="openai", prompts=builtin_prompts(),
                      workload_split=ArmSplit.parse("auto,off"), output=OutputLength.parse("8"), concurrency=2,
                      requests=6, timeout_s=60.0, probe=False)
    result = run_bench(cfg)
    assert result.config["protocol"] == "openai" and len(result.records) == 6
    for r in result.records:
        assert r.answered, r.error
        assert r.output_tokens == 8 and r.input_tokens > 0 and r.ttft_s is not None and r.ttft_s <= r.e2e_s
        assert (r.drafted > 0) == (r.arm == "auto")  # the arm reached spec_decode as `speculation`


def test_bench_names_the_model_the_endpoint_serves(served):
    from trtspec.bench import ArmSplit, BenchConfig, OutputLength, builtin_prompts, run_bench

    with OpenAIServer(served[0].endpoints.grpc, served_name="org/renamed") as renamed:  # --openai-model-name
        cfg = BenchConfig(url=renamed.url, protocol="openai", prompts=builtin_prompts(),
                          workload_split=ArmSplit.parse("off"), output=OutputLength.parse("4"), concurrency=2,
                          requests=2, timeout_s=60.0, probe=False)
        records = run_bench(cfg).records
    assert [r.output_tokens for r in records] == [4, 4], [r.error for r in records]  # not a 404 for spec_decode
