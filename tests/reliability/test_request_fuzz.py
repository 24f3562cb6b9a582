"""Property-based tests of the request parser: any value of any input either parses into a
valid request or is refused with a one-line ``InvalidRequestError``; nothing else escapes."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trtspec.errors import InvalidRequestError
from trtspec.wire import SPEC_DECODE_INPUTS, Priority
from trtspec.serving.request import MAX_STOP_WORDS, ServeRequest, parse_request

LIMIT = 200
TEXT_LIMIT = 64 * 1024
NAMES = [s.name for s in SPEC_DECODE_INPUTS]
DTYPES = [np.bool_, np.int8, np.int32, np.int64, np.uint64, np.float16, np.float32, np.float64, np.object_]

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20),
    st.binary(max_size=20),
    st.sampled_from(["", "auto", "on", "off", "OFF", " high ", "low", "\ud800", "x" * 70_000]),
)


@st.composite
def arrays(draw) -> np.ndarray:
    """A numpy array of a random dtype and shape ([1, 1] is what a well-formed request carries)."""
    dtype = draw(st.sampled_from(DTYPES))
    shape = draw(st.sampled_from([(1, 1), (1,), (), (2, 1), (1, 3), (0,), (1, 0)]))
    n = int(np.prod(shape)) if shape else 1
    if dtype is np.object_:
        items = draw(st.lists(st.one_of(st.binary(max_size=12), st.text(max_size=12)), min_size=n, max_size=n))
        arr = np.empty(n, dtype=object)
        arr[:] = items
    elif dtype is np.bool_:
        arr = np.array(draw(st.lists(st.booleans(), min_size=n, max_size=n)), dtype=dtype)
    elif np.issubdtype(dtype, np.integer):
        info = np.iinfo(dtype)
        arr = np.array(draw(st.lists(st.integers(int(info.min), int(info.max)), min_size=n, max_size=n)), dtype=dtype)
    else:
        with np.errstate(over="ignore", invalid="ignore"):  # float16 cannot hold every float32
            arr = np.array(draw(st.lists(st.floats(width=32), min_size=n, max_size=n)), dtype=dtype)
    return arr.reshape(shape)


values = st.one_of(scalars, arrays(), st.lists(scalars, max_size=4), st.dictionaries(st.text(max_size=3), scalars, max_size=2))


def check(inputs: dict) -> ServeRequest | str:
    """Parse; return the request, or the error message after checking it is one short line."""
    try:
        req = parse_request(lambda name: inputs.get(name), max_tokens_limit=LIMIT, max_text_bytes=TEXT_LIMIT)
    except InvalidRequestError as e:
        msg = str(e)
        assert msg and "\n" not in msg and len(msg) < 300, msg
        return msg
    assert isinstance(req.text, str) and req.text and len(req.text.encode("utf-8")) <= TEXT_LIMIT
    assert 1 <= req.max_tokens <= LIMIT
    req.sampling.validate()
    s = req.sampling
    assert s.greedy or s.temperature >= 1e-5  # tiny temperatures are greedy: float32 stays finite
    assert 1e-30 <= s.top_p <= 1.0 and 0 <= s.top_k < 2**31 and (s.seed is None or 0 <= s.seed < 2**64)
    assert len(req.stop_words) <= MAX_STOP_WORDS and all(req.stop_words)
    assert req.priority in Priority
    return req


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(st.sampled_from(NAMES + ["bogus"]), values, max_size=len(NAMES)))
def test_any_inputs_parse_or_are_refused_in_one_line(inputs):
    check(inputs)


@settings(max_examples=600, deadline=None)
@given(
    text=st.text(min_size=1, max_size=200),
    max_tokens=st.integers(1, LIMIT),
    temperature=st.floats(0, 10),
    top_k=st.integers(0, 1000),
    top_p=st.floats(0, 1, exclude_min=True),
    seed=st.one_of(st.none(), st.integers(0, 2**63 - 1)),
    stops=st.lists(st.text(max_size=20), max_size=8),
    priority=st.sampled_from([p.value for p in Priority]),
    speculation=st.sampled_from(["auto", "on", "off", ""]),
)
def test_well_formed_requests_are_accepted_as_sent(text, max_tokens, temperature, top_k, top_p, seed, stops, priority, speculation):
    """The shapes a gRPC client sends ([1, 1] tensors, bytes for strings)."""
    inputs = {
        "text_input": np.array([[text.encode()]], dtype=object),
        "max_tokens": np.array([[max_tokens]], dtype=np.int32),
        "temperature": np.array([[temperature]], dtype=np.float64),
        "top_k": np.array([[top_k]], dtype=np.int32),
        "top_p": np.array([[top_p]], dtype=np.float64),
        "stop_words": np.array([[w.encode() for w in stops]], dtype=object).reshape(1, -1),
        "priority": np.array([[priority.encode()]], dtype=object),
        "speculation": np.array([[speculation.encode()]], dtype=object),
    }
    if seed is not None:
        inputs["seed"] = np.array([[seed]], dtype=np.int64)
    req = check(inputs)
    assert isinstance(req, ServeRequest), req
    assert req.text == text and req.max_tokens == max_tokens and req.sampling.top_k == top_k
    assert req.stop_words == tuple(w for w in stops if w) and req.priority == priority
    assert req.sampling.temperature == (0.0 if temperature < 1e-5 else temperature)


BAD = {
    "empty text": ({"text_input": "", "max_tokens": 5}, "text_input is empty"),
    "huge text": ({"text_input": "x" * (TEXT_LIMIT + 1), "max_tokens": 5}, f"this server takes at most {TEXT_LIMIT}"),
    "invalid UTF-8": ({"text_input": b"\xff\xfe", "max_tokens": 5}, "is not valid UTF-8"),
    "lone surrogate": ({"text_input": "a\ud800", "max_tokens": 5}, "is not valid UTF-8"),
    "float max_tokens": ({"text_input": "hi", "max_tokens": 2.5}, "must be an integer"),
    "string max_tokens": ({"text_input": "hi", "max_tokens": "ten"}, "must be an integer"),
    "negative max_tokens": ({"text_input": "hi", "max_tokens": -3}, "max_tokens must be > 0, got -3"),
    "huge max_tokens": ({"text_input": "hi", "max_tokens": 2**62}, f"max_tokens must be <= {LIMIT}"),
    "two prompts": ({"text_input": np.array([[b"a"], [b"b"]], dtype=object), "max_tokens": 5}, "must hold one value"),
    "NaN temperature": ({"text_input": "hi", "max_tokens": 5, "temperature": math.nan}, "must be finite"),
    "huge int temperature": ({"text_input": "hi", "max_tokens": 5, "temperature": 10**400}, "must be finite"),
    "negative temperature": ({"text_input": "hi", "max_tokens": 5, "temperature": -1.0}, "temperature must be >= 0"),
    "top_p negative": ({"text_input": "hi", "max_tokens": 5, "top_p": -0.5}, "top_p must be in (0, 1]"),
    "top_p 1.5": ({"text_input": "hi", "max_tokens": 5, "top_p": 1.5}, "top_p must be in (0, 1]"),
    "negative top_k": ({"text_input": "hi", "max_tokens": 5, "top_k": -1}, "top_k must be an integer >= 0 and <="),
    "huge top_k": ({"text_input": "hi", "max_tokens": 5, "top_k": 2**40}, "top_k must be an integer >= 0 and <="),
    "negative seed": ({"text_input": "hi", "max_tokens": 5, "seed": -1}, "seed must be a non-negative integer < 2**64, got -1"),
    "huge seed": ({"text_input": "hi", "max_tokens": 5, "seed": 2**70}, "seed must be a non-negative integer < 2**64"),
    "unknown speculation": ({"text_input": "hi", "max_tokens": 5, "speculation": "maybe"}, "speculation must be one of"),
    "huge speculation": ({"text_input": "hi", "max_tokens": 5, "speculation": "z" * 10_000}, "speculation must be one of"),
    "bad priority": ({"text_input": "hi", "max_tokens": 5, "priority": 7}, "must be a string"),
    "thousands of stop words": (
        {"text_input": "hi", "max_tokens": 5, "stop_words": [f"s{i}" for i in range(5000)]},
        f"at most {MAX_STOP_WORDS} stop_words, got 5000",
    ),
    "a huge stop word": ({"text_input": "hi", "max_tokens": 5, "stop_words": ["x" * 5000]}, "at most 256 characters"),
    "thousands of bad words": (
        {"text_input": "hi", "max_tokens": 5, "bad_words": [f"b{i}" for i in range(5000)]},
        f"at most {MAX_STOP_WORDS} bad_words, got 5000",
    ),
    "a huge bad word": ({"text_input": "hi", "max_tokens": 5, "bad_words": ["x" * 5000]}, "at most 256 characters"),
    "stream as a string": ({"text_input": "hi", "max_tokens": 5, "stream": "yes"}, "must be a boolean"),
    "dict value": ({"text_input": {"a": 1}, "max_tokens": 5}, "must be a string"),
}


@pytest.mark.parametrize("name", list(BAD))
def test_hand_picked_bad_inputs_are_refused_in_one_line(name):
    inputs, expected = BAD[name]
    msg = check(inputs)
    assert isinstance(msg, str) and expected in msg, msg


def test_normalisations_keep_sampling_finite():
    tiny_t = check({"text_input": "hi", "max_tokens": 5, "temperature": 1e-300})
    assert tiny_t.sampling.greedy
    tiny_p = check({"text_input": "hi", "max_tokens": 5, "temperature": 1.0, "top_p": 1e-300})
    assert tiny_p.sampling.top_p == 1e-30
    import torch

    from trtspec.decoding.acceptance import warp_probs

    probs = warp_probs(torch.randn(2, 50) * 10, tiny_p.sampling)
    assert torch.isfinite(probs).all() and torch.allclose(probs.max(-1).values, torch.ones(2))
