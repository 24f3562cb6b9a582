"""Validation of the client interface, without a server: every rule, its one-line message."""

from __future__ import annotations

import json

import numpy as np
import pytest

from trtspec.errors import InvalidRequestError
from trtspec.protocol import Speculation
from trtspec.serving.request import parse_request


def lookup(**values):
    """Inputs as Triton hands them to the model: numpy arrays with the batch dimension."""
    arrays = {}
    for k, v in values.items():
        if isinstance(v, np.ndarray):
            arrays[k] = v
        elif isinstance(v, (str, bytes)) or (isinstance(v, list) and v and isinstance(v[0], (str, bytes))):
            items = v if isinstance(v, list) else [v]
            arrays[k] = np.array([[i.encode() if isinstance(i, str) else i for i in items]], dtype=object)
        elif isinstance(v, bool):
            arrays[k] = np.array([[v]], dtype=bool)
        elif isinstance(v, int):
            arrays[k] = np.array([[v]], dtype=np.int32)
        else:
            arrays[k] = np.array([[v]], dtype=np.float32)
    return arrays.get


def parse(limit: int = 100, **values):
    return parse_request(lookup(**values), max_tokens_limit=limit, request_id="r1")


def test_minimal_request_gets_the_defaults():
    r = parse(text_input="hello", max_tokens=5)
    assert (r.text, r.max_tokens, r.stream, r.priority, r.request_id) == ("hello", 5, False, "normal", "r1")
    assert r.sampling.greedy and r.sampling.top_k == 0 and r.sampling.top_p == 1.0 and r.sampling.seed is None
    assert r.speculation is Speculation.auto and r.stop_words == ()


def test_every_optional_input_is_read():
    r = parse(
        text_input="héllo",
        max_tokens=7,
        stream=True,
        temperature=0.5,
        top_k=40,
        top_p=0.9,
        seed=np.array([[3]], dtype=np.int64),
        stop_words=["\n\n", "", "END"],
        priority="HIGH",
        speculation="OFF",
        bad_words=[""],
    )
    assert r.text == "héllo" and r.stream and r.priority == "high"
    assert r.sampling.temperature == 0.5 and r.sampling.top_k == 40 and r.sampling.top_p == pytest.approx(0.9)
    assert r.sampling.seed == 3
    assert r.stop_words == ("\n\n", "END")  # empty stop words are dropped (TensorRT-LLM clients send "")
    assert r.speculation is Speculation.off


def test_random_seed_is_the_tensorrt_llm_name_for_seed():
    r = parse(text_input="x", max_tokens=1, random_seed=np.array([[9]], dtype=np.uint64))
    assert r.sampling.seed == 9


def test_generate_parameters_are_read_when_no_tensor_carries_the_input():
    params = json.loads('{"temperature": 0.7, "stream": true, "stop_words": ["a"]}')
    tensors = lookup(text_input="x", max_tokens=3)

    def get(name):
        t = tensors(name)
        return t if t is not None else params.get(name)

    r = parse_request(get, max_tokens_limit=10)
    assert r.sampling.temperature == pytest.approx(0.7) and r.stream and r.stop_words == ("a",)


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (dict(max_tokens=5), "input 'text_input' is required"),
        (dict(text_input="x"), "input 'max_tokens' is required"),
        (dict(text_input="x", max_tokens=0), "max_tokens must be > 0, got 0"),
        (dict(text_input="x", max_tokens=-3), "max_tokens must be > 0, got -3"),
        (dict(text_input="x", max_tokens=101), "max_tokens must be <= 100 (this server's limit), got 101"),
        (dict(text_input="x", max_tokens=True), "input 'max_tokens' must be an integer"),
        (dict(text_input="x", max_tokens=2.5), "input 'max_tokens' must be an integer"),
        (dict(text_input=np.array([[1]], dtype=np.int32), max_tokens=2), "input 'text_input' must be a string"),
        (dict(text_input=["a", "b"], max_tokens=2), "must hold one value (one prompt per request, batch size 1), got 2"),
        (dict(text_input=np.array([[b"\xff\xfe"]], dtype=object), max_tokens=2), "input 'text_input' is not valid UTF-8"),
        (dict(text_input="x", max_tokens=2, speculation="maybe"), "speculation must be one of auto, on, off; got 'maybe'"),
        (dict(text_input="x", max_tokens=2, temperature=-1.0), "temperature must be >= 0"),
        (dict(text_input="x", max_tokens=2, temperature=float("nan")), "input 'temperature' must be finite"),
        (dict(text_input="x", max_tokens=2, top_p=0.0), "top_p must be in (0, 1]"),
        (dict(text_input="x", max_tokens=2, top_k=-1), "top_k must be an integer >= 0"),
        (dict(text_input="x", max_tokens=2, seed=-4), "seed must be a non-negative integer"),
        (dict(text_input="x", max_tokens=2, priority="urgent"), "priority must be one of high, normal, low; got 'urgent'"),
        (dict(text_input="x", max_tokens=2, priority=2), "input 'priority' must be a string"),
        (dict(text_input="x", max_tokens=2, stream=np.array([[1]], dtype=np.int32)), "input 'stream' must be a boolean"),
        (dict(text_input="x", max_tokens=2, bad_words=["damn"]), "bad_words is not supported"),
    ],
)
def test_bad_requests_get_one_line_messages(values, message):
    with pytest.raises(InvalidRequestError) as e:
        parse(**values)
    assert message in str(e.value)
    assert "\n" not in str(e.value)
