"""Validation of the client interface, without a server: every rule, its one-line message."""

from __future__ import annotations

import json

import numpy as np
import pytest

from trtspec.errors import InvalidRequestError
from trtspec.decoding.types import DrafterKind, LogitBias, Penalties
from trtspec.wire import Speculation
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


def parse(limit: int = 100, default_exact: bool = False, **values):
    return parse_request(lookup(**values), max_tokens_limit=limit, request_id="r1", default_exact=default_exact)


def test_minimal_request_gets_the_defaults():
    r = parse(text_input="hello", max_tokens=5)
    assert (r.text, r.max_tokens, r.stream, r.priority, r.request_id) == ("hello", 5, False, "normal", "r1")
    assert r.sampling.greedy and r.sampling.top_k == 0 and r.sampling.top_p == 1.0 and r.sampling.seed is None
    assert r.speculation is Speculation.AUTO and r.stop_words == ()
    assert r.apply_chat_template is None  # the model's parameter decides


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
        apply_chat_template=False,
        drafter="Suffix",
    )
    assert r.drafter is DrafterKind.SUFFIX
    assert r.text == "héllo" and r.stream and r.priority == "high" and r.apply_chat_template is False
    assert r.sampling.temperature == 0.5 and r.sampling.top_k == 40 and r.sampling.top_p == pytest.approx(0.9)
    assert r.sampling.seed == 3
    assert r.stop_words == ("\n\n", "END")  # empty stop words are dropped (TensorRT-LLM clients send "")
    assert r.speculation is Speculation.OFF


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
        (dict(text_input="x", max_tokens=2, drafter="lookup"), "drafter must be one of model, ngram, suffix, auto; got 'lookup'"),
        (dict(text_input="x", max_tokens=2, temperature=-1.0), "temperature must be >= 0"),
        (dict(text_input="x", max_tokens=2, temperature=float("nan")), "input 'temperature' must be finite"),
        (dict(text_input="x", max_tokens=2, top_p=-0.1), "top_p must be in (0, 1]"),
        (dict(text_input="x", max_tokens=2, top_k=-1), "top_k must be an integer >= 0"),
        (dict(text_input="x", max_tokens=2, seed=-4), "seed must be a non-negative integer"),
        (dict(text_input="x", max_tokens=2, priority="urgent"), "priority must be one of high, normal, low; got 'urgent'"),
        (dict(text_input="x", max_tokens=2, priority=2), "input 'priority' must be a string"),
        (dict(text_input="x", max_tokens=2, stream=np.array([[1]], dtype=np.int32)), "input 'stream' must be a boolean"),
        (dict(text_input="x", max_tokens=2, bad_words=["w"] * 65), "at most 64 bad_words, got 65"),
    ],
)
def test_bad_requests_get_one_line_messages(values, message):
    with pytest.raises(InvalidRequestError) as e:
        parse(**values)
    assert message in str(e.value)
    assert "\n" not in str(e.value)


def test_exact_selects_position_keyed_sampling():
    assert not parse(text_input="x", max_tokens=1).sampling.exact
    r = parse(text_input="x", max_tokens=1, temperature=np.array([[0.7]], dtype=np.float32),
              seed=np.array([[3]], dtype=np.int64), exact=np.array([[True]]))
    assert r.sampling.exact and r.sampling.seed == 3


def test_a_request_without_exact_takes_the_policys_default():
    assert parse(text_input="x", max_tokens=1, default_exact=True).sampling.exact
    assert not parse(text_input="x", max_tokens=1, default_exact=True, exact=np.array([[False]])).sampling.exact


def test_top_p_zero_is_tensorrt_llms_off_and_with_top_k_off_greedy():
    assert parse(text_input="x", max_tokens=1, temperature=1.0, top_p=0.0, top_k=0).sampling.greedy
    r = parse(text_input="x", max_tokens=1, temperature=1.0, top_p=0.0, top_k=40).sampling
    assert not r.greedy and r.top_p == 1.0 and r.top_k == 40


@pytest.mark.parametrize(("values", "message"), [
    (dict(beam_width=np.array([[4]], dtype=np.int32)), "beam_width 4: trtspec decodes one beam (only 1)"),
    (dict(return_context_logits=True), "return_context_logits True: trtspec does not support return_context_logits"),
    (dict(repetition_penalty=np.array([[0.0]], dtype=np.float32)), "repetition_penalty must be > 0, got 0.0"),
    (dict(presence_penalty=float("nan")), "input 'presence_penalty' must be finite, got nan"),
    (dict(frequency_penalty="high"), "input 'frequency_penalty' must be a number, got "),
    (dict(decoder_text_input=np.array([[b"x"]], dtype=object)), "decoder_text_input 'x': trtspec serves decoder-only"),
    (dict(prompt_embedding_table=np.ones((1, 2, 3), dtype=np.float16)), "prompt_embedding_table 1.0: trtspec does no"),
    (dict(num_draft_tokens=-1), "num_draft_tokens must be >= 0, got -1"),
    (dict(num_draft_tokens=0, speculation="on"), "num_draft_tokens 0 contradicts speculation 'on'"),
    (dict(end_id=-2), "end_id must be a token id, or -1 for none; got -2"),
    (dict(min_tokens=2), "min_tokens must be >= 0 and <= max_tokens (1), got 2"),
    (dict(min_length=-1), "min_length must be >= 0 and <= max_tokens (1), got -1"),
    (dict(min_tokens=1, min_length=0), "min_tokens 1 and min_length 0 differ; send one of them"),
    (dict(return_log_probs=True, top_logprobs=21), "top_logprobs must be >= 0 and <= 20, got 21"),
    (dict(logit_bias_ids=[1, 2], logit_bias_values=[0.5]), "logit_bias_ids holds 2 ids and logit_bias_values 1"),
    (dict(logit_bias_ids=[-3], logit_bias_values=[0.5]), "logit_bias_ids must be token ids (>= 0), got -3"),
    (dict(logit_bias_ids=[3], logit_bias_values=[float("inf")]), "input 'logit_bias_values' must be finite"),
    (dict(embedding_bias_words=["a", "b"], embedding_bias_weights=[1.0]), "embedding_bias_words holds 2 words and"),
    (dict(top_logprobs=2), "top_logprobs 2 needs return_log_probs true"),
])
def test_tensorrt_llm_inputs_we_cannot_honour_are_refused_naming_the_value(values, message):
    with pytest.raises(InvalidRequestError) as info:
        parse(text_input="x", max_tokens=1, **values)
    assert str(info.value).startswith(message)


def test_tensorrt_llm_inputs_at_their_neutral_values_pass_and_the_honoured_ones_are_read():
    r = parse(text_input="x", max_tokens=1, beam_width=1, num_return_sequences=1, repetition_penalty=1.0,
              min_tokens=1, return_log_probs=False, length_penalty=0.7, pad_id=2, use_draft_logits=True,
              return_perf_metrics=True, embedding_bias_words=[""], exclude_input_in_output=False,
              num_draft_tokens=3, end_id=-1)
    assert r.echo_prompt and r.max_draft_tokens == 3 and r.end_id == -1 and r.min_tokens == 1
    assert parse(text_input="x", max_tokens=1, num_draft_tokens=0).speculation is Speculation.OFF
    streamed = parse(text_input="x", max_tokens=1, stream=True, exclude_input_in_output=False)
    assert not streamed.echo_prompt  # TensorRT-LLM streams only the new tokens
    assert not r.logprobs and parse(text_input="x", max_tokens=1, return_log_probs=np.array([[True]])).logprobs
    assert parse(text_input="x", max_tokens=1, return_log_probs=True, top_logprobs=20).top_logprobs == 20


def test_penalties_are_read_with_tensorrt_llms_neutral_defaults():
    assert parse(text_input="x", max_tokens=1).sampling.penalties == Penalties()
    r = parse(text_input="x", max_tokens=1, repetition_penalty=np.array([[1.25]], dtype=np.float32),
              presence_penalty=0.5, frequency_penalty=np.array([[-0.25]], dtype=np.float32))
    assert r.sampling.penalties == Penalties(repetition=1.25, presence=0.5, frequency=-0.25)


def test_logit_bias_and_tensorrt_llms_embedding_bias_are_read():
    r = parse(text_input="x", max_tokens=1, logit_bias_ids=np.array([[9, 3, 9]], dtype=np.int64),
              logit_bias_values=np.array([[1.0, -2.0, 0.5]], dtype=np.float32),
              embedding_bias_words=["hot", "", "cold"], embedding_bias_weights=[2.0, 7.0, -1.0])
    assert r.sampling.logit_bias == LogitBias((3, 9), (-2.0, 1.5))  # one value per id, repeats summed
    assert r.bias_words == (("hot", 2.0), ("cold", -1.0))  # the empty word dropped
    assert parse(text_input="x", max_tokens=1, embedding_bias_words=[""]).bias_words == ()  # TensorRT-LLM's "none"


def test_bad_words_are_read_without_the_empty_ones():
    assert parse(text_input="x", max_tokens=2, bad_words=["damn", "", " heck"]).bad_words == ("damn", " heck")
    assert parse(text_input="x", max_tokens=2, bad_words=[""]).bad_words == ()


@pytest.mark.parametrize("name", ["min_tokens", "min_length"])
def test_min_tokens_or_tensorrt_llms_older_min_length_holds_back_eos(name):
    """genai-perf sends min_length = max_tokens for outputs of a fixed length (--output-tokens-mean-deterministic)."""
    assert parse(text_input="x", max_tokens=64, **{name: np.array([[64]], dtype=np.int32)}).min_tokens == 64
    assert parse(text_input="x", max_tokens=64, min_tokens=8, min_length=8).min_tokens == 8
    assert parse(text_input="x", max_tokens=64).min_tokens == 0
