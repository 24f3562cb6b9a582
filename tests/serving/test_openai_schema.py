"""The OpenAI endpoint without a server: request bodies -> spec_decode inputs, response bodies, error codes,
and the chat template rendered once."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from trtspec.decoding.types import Penalties
from trtspec.runtime.tokenizer import Tokenizer
from trtspec.serving.client import ClientError, ClientResult, error_code
from trtspec.serving.openai_api.app import _as_openai_error
from trtspec.serving.openai_api.render import Renderer
from trtspec.serving.openai_api.schema import ChatCompletionRequest, CompletionRequest, OpenAIError
from trtspec.serving.request import parse_request
from trtspec.serving.service import CLIENT_CANCELLED, SHUTTING_DOWN
from trtspec.testing.tiny import CHATML


def chat(**fields) -> ChatCompletionRequest:
    return ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "hi"}], **fields)


def test_openai_defaults_become_spec_decode_inputs():
    p = chat().params(None, 300, apply_chat_template=False)
    # OpenAI samples at temperature 1 unless told; chat without max_tokens gets the server's limit
    assert p.fields() == {"max_tokens": 300, "temperature": 1.0, "top_p": 1.0, "apply_chat_template": False}
    c = CompletionRequest(model="m", prompt=["one prompt"], stop="END", seed=3, temperature=0,
                          speculation="off", top_k=5)
    c.refuse_unsupported()
    assert c.requested_max_tokens == 16 and c.text() == "one prompt"  # OpenAI's completions default
    assert c.params(c.requested_max_tokens, 300, apply_chat_template=False).fields() == {
        "max_tokens": 16, "temperature": 0.0, "top_k": 5, "top_p": 1.0, "seed": 3, "speculation": "off",
        "stop_words": ["END"], "apply_chat_template": False}


def test_drafter_extension_becomes_the_drafter_input():
    assert chat(drafter="suffix").params(8, 300, apply_chat_template=False).fields()["drafter"] == "suffix"
    assert "drafter" not in chat().params(8, 300, apply_chat_template=False).fields()
    with pytest.raises(ValidationError, match="drafter"):
        chat(drafter="oracle")


def test_max_completion_tokens_wins_over_max_tokens():
    assert chat(max_tokens=10, max_completion_tokens=20).requested_max_tokens == 20
    assert chat(max_tokens=10).requested_max_tokens == 10


@pytest.mark.parametrize(("request_", "param"), [
    (lambda: chat(n=3), "n"),
    (lambda: chat(tools=[{"type": "function"}]), "tools"),
    (lambda: chat(response_format={"type": "json_object"}), "response_format"),
    (lambda: chat(stream_options={"include_usage": True}), "stream_options"),  # without stream
    (lambda: CompletionRequest(model="m", prompt=["a", "b"]), "prompt"),
    (lambda: CompletionRequest(model="m", prompt=[1, 2, 3]), "prompt"),  # token ids
    (lambda: CompletionRequest(model="m", prompt=[[1, 2], [3]]), "prompt"),
    (lambda: CompletionRequest(model="m", prompt="a", echo=True, logprobs=0), "echo"),  # the prompt's: not computed
    (lambda: CompletionRequest(model="m", prompt="a", best_of=2), "best_of"),
    (lambda: chat(logit_bias={"x42": 5.0}), "logit_bias"),  # a key that is no token id
    (lambda: chat(logit_bias={"42": 101.0}), "logit_bias"),  # OpenAI's range: -100..100
    (lambda: chat(top_logprobs=2), "top_logprobs"),  # without logprobs: OpenAI refuses it too
    (lambda: CompletionRequest(model="m", prompt="a", suffix="and then"), "suffix"),
])
def test_what_we_cannot_honour_is_refused_naming_the_field(request_, param):
    with pytest.raises(OpenAIError) as info:
        request_().refuse_unsupported()
    assert info.value.status == 400 and info.value.param == param and "\n" not in info.value.message


@pytest.mark.parametrize(("request_", "param"), [
    (lambda: ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "ok"},
                                                        {"role": "user", "content": "a\ud800"}]), "messages.1.content"),
    (lambda: ChatCompletionRequest(model="m", messages=[{"role": "user",
                                                         "content": [{"type": "text", "text": "\udc80"}]}]),
     "messages.0.content"),
    (lambda: CompletionRequest(model="m", prompt=["\ud800"]), "prompt"),
    (lambda: chat(stop=["fine", "\udfff"]), "stop.1"),
    (lambda: chat(bad_words=["\ud800x"]), "bad_words.0"),
])
def test_text_that_utf8_cannot_carry_is_refused_naming_its_field(request_, param):
    # JSON carries a lone surrogate as "\ud800"; before, the gRPC client failed to encode it: a 500
    with pytest.raises(OpenAIError) as info:
        request_().refuse_unsupported()
    assert info.value.status == 400 and info.value.param == param
    assert info.value.message.startswith(f"{param} is not valid text: surrogates not allowed (character ")


def test_logprobs_of_the_chosen_tokens_are_asked_of_spec_decode():
    assert chat(logprobs=True, top_logprobs=0).params(8, 300, apply_chat_template=False).fields()["return_log_probs"]
    assert chat(logprobs=True, top_logprobs=4).params(8, 300, apply_chat_template=False).fields()["top_logprobs"] == 4
    assert CompletionRequest(model="m", prompt="a", logprobs=0).params(8, 300, False).logprobs
    assert CompletionRequest(model="m", prompt="a", logprobs=5).params(8, 300, False).top_logprobs == 5
    with pytest.raises(ValidationError, match="logprobs"):
        CompletionRequest(model="m", prompt="a", logprobs=6)  # OpenAI's range: 0..5
    assert "return_log_probs" not in chat().params(8, 300, apply_chat_template=False).fields()
    assert not CompletionRequest(model="m", prompt="a").wants_logprobs


def test_logit_bias_becomes_spec_decodes_logit_bias():
    fields = chat(logit_bias={"42": 5.0, " 7": -100}).params(8, 300, apply_chat_template=False).fields()
    assert (fields["logit_bias_ids"], fields["logit_bias_values"]) == ([7, 42], [-100.0, 5.0])
    assert "logit_bias_ids" not in chat(logit_bias={}).params(8, 300, apply_chat_template=False).fields()


def test_neutral_values_of_unsupported_fields_pass():
    chat(n=1, logprobs=False, presence_penalty=0.0, response_format={"type": "text"}, repetition_penalty=1.0,
         min_tokens=1).refuse_unsupported()


def test_penalties_become_spec_decodes_inputs_with_its_meaning():
    """The same Penalties on spec_decode's side as on the endpoint's; neutral ones are not sent."""
    request = chat(presence_penalty=0.5, frequency_penalty=-1.0, repetition_penalty=1.3)  # the last: vLLM's
    fields = request.params(8, 300, apply_chat_template=False).fields()
    assert {name: fields[name] for name in ("presence_penalty", "frequency_penalty", "repetition_penalty")} == {
        "presence_penalty": 0.5, "frequency_penalty": -1.0, "repetition_penalty": 1.3}
    parsed = parse_request(lambda name: fields.get(name) if name != "text_input" else "hi", max_tokens_limit=300)
    assert parsed.sampling.penalties == Penalties(repetition=1.3, presence=0.5, frequency=-1.0)
    neutral = chat(presence_penalty=0.0, frequency_penalty=0.0, repetition_penalty=1.0)
    assert not {"presence_penalty", "frequency_penalty", "repetition_penalty"} & set(
        neutral.params(8, 300, apply_chat_template=False).fields())
    for bad in ({"presence_penalty": 2.5}, {"frequency_penalty": -3.0}, {"repetition_penalty": 0.0}):
        with pytest.raises(ValidationError, match=next(iter(bad))):
            chat(**bad)


def test_vllms_ignore_eos_min_tokens_and_bad_words_become_spec_decodes_inputs():
    request = chat(ignore_eos=True, min_tokens=16, bad_words=[" no", ""])
    fields = request.params(32, 300, apply_chat_template=False).fields()
    assert fields["end_id"] == -1 and fields["min_tokens"] == 16 and fields["bad_words"] == [" no", ""]
    plain = chat(min_tokens=0, bad_words=[]).params(8, 300, apply_chat_template=False).fields()
    assert not {"end_id", "min_tokens", "bad_words"} & set(plain)
    with pytest.raises(ValidationError, match="min_tokens"):
        chat(min_tokens=-1)


def test_fields_we_do_not_know_are_ignored():
    """As OpenAI-compatible servers do: a newer SDK's field is not an error."""
    request = chat(user="u-1", metadata={"k": "v"}, some_future_field=3)
    request.refuse_unsupported()
    assert not hasattr(request, "some_future_field")
    assert request.params(8, 300, apply_chat_template=False).fields() == chat().params(8, 300, apply_chat_template=False).fields()


def test_image_content_is_refused_and_text_parts_are_joined():
    parts = ChatCompletionRequest(model="m", messages=[
        {"role": "developer", "content": "be brief"},
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}])
    assert parts.chat() == [{"role": "system", "content": "be brief"}, {"role": "user", "content": "ab"}]
    image = ChatCompletionRequest(model="m", messages=[{"role": "user", "content": [{"type": "image_url"}]}])
    with pytest.raises(OpenAIError, match="'image_url' is not supported"):
        image.chat()


def result(**kw) -> ClientResult:
    base = dict(text="hello", finish_reason="context", num_input_tokens=7, num_output_tokens=3,
                num_draft_tokens=4, num_accepted_tokens=2, acceptance_rate=0.5)
    return ClientResult(**{**base, **kw})


def test_bodies_carry_usage_finish_reason_and_the_acceptance_figures():
    body = Renderer("chat", "m", id="x").body(result())
    assert body["choices"][0]["message"] == {"role": "assistant", "content": "hello"}
    assert body["choices"][0]["finish_reason"] == "length"  # the context window filled up
    assert body["usage"] == {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10}
    assert body["trtspec"] == {"num_draft_tokens": 4, "num_accepted_tokens": 2, "acceptance_rate": 0.5}
    text = Renderer("completions", "m").body(result(finish_reason="stop"))
    assert text["object"] == "text_completion" and text["choices"][0]["text"] == "hello"
    assert text["choices"][0]["finish_reason"] == "stop" and text["id"].startswith("cmpl-")


def test_stream_chunks():
    r = Renderer("chat", "m")
    assert r.chunk(role=True)["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert r.chunk("he", with_usage_field=True)["usage"] is None
    last = r.chunk(result=result(finish_reason="length"))
    assert last["choices"][0]["delta"] == {} and last["choices"][0]["finish_reason"] == "length" and "trtspec" in last
    assert r.usage_chunk(result())["choices"] == [] and r.usage_chunk(result())["usage"]["total_tokens"] == 10


@pytest.mark.parametrize(("message", "code"), [
    ("max_tokens must be <= 200 (this server's limit), got 201", "INVALID_ARG"),
    ("prompt has 900 tokens; the context window holds 256, leaving no room to generate", "INVALID_ARG"),
    ("speculation 'on' needs a draft model; this deployment serves the target alone", "INVALID_ARG"),
    ("server busy: 72 requests in flight; unavailable, retry later", "UNAVAILABLE"),
    ("model 'target' did not answer within 60s", "UNAVAILABLE"),
    ("model 'target' is unavailable (reloading: x); retry shortly", "UNAVAILABLE"),
    (SHUTTING_DOWN, "UNAVAILABLE"),
    ("internal error: KeyError: 'x'", "INTERNAL"),
    (CLIENT_CANCELLED, "CANCELLED"),
    ("[request id: r1] unexpected inference input 'foo' for model 'spec_decode'", "INVALID_ARG"),
    ("Request for unknown model: 'x' is not found", "NOT_FOUND"),
])
def test_error_codes_are_read_from_spec_decodes_messages(message, code):
    assert error_code(ClientError(message)) == code


@pytest.mark.parametrize(("message", "status", "kind"), [
    ("max_tokens must be <= 200 (this server's limit), got 201", 400, "invalid_request_error"),
    ("Request for unknown model: 'x' is not found", 404, "invalid_request_error"),
    ("server busy: 72 requests in flight; unavailable, retry later", 503, "service_unavailable_error"),
    (CLIENT_CANCELLED, 499, "cancelled"),
    ("internal error: KeyError: 'x'", 500, "server_error"),  # any other error is a 500
])
def test_spec_decodes_errors_become_openais_statuses_and_error_types(message, status, kind):
    error = _as_openai_error(ClientError(message))
    assert error.status == status and error.body()["error"]["type"] == kind
    assert error.body()["error"]["message"] == message


def test_a_code_the_transport_gave_is_kept():
    assert error_code(ClientError("whatever", code="StatusCode.UNAVAILABLE")) == "UNAVAILABLE"


def test_the_chat_template_is_rendered_once_and_encodes_as_the_template_does(tiny_target: Path):
    tok = Tokenizer.from_dir(tiny_target)
    tok.hf.chat_template = CHATML
    messages = [{"role": "system", "content": "s"}, {"role": "user", "content": "The quick brown fox"}]
    text = tok.render_chat(messages)
    assert text.count("<|im_start|>assistant") == 1 and text.endswith("<|im_start|>assistant\n")
    expected = tok.hf.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    expected = expected["input_ids"] if hasattr(expected, "keys") else expected
    assert tok.encode_prompt(text, raw=True) == list(expected)
    # a template that writes the BOS itself, with a tokenizer that adds one: the prompt starts with one BOS
    tok.hf.chat_template = "{{ bos_token }}" + CHATML
    tok.hf._tokenizer.post_processor = _bos_adder(tok)
    ids = tok.encode_prompt(tok.render_chat(messages), raw=True)
    assert ids[0] == tok.hf.bos_token_id and ids[1] != tok.hf.bos_token_id


def _bos_adder(tok: Tokenizer):
    from tokenizers.processors import TemplateProcessing

    return TemplateProcessing(single="<s> $A", special_tokens=[("<s>", tok.hf.bos_token_id)])


def test_without_a_chat_template_render_chat_refuses(tiny_target: Path):
    from trtspec.errors import InvalidRequestError

    with pytest.raises(InvalidRequestError, match="no chat template"):
        Tokenizer.from_dir(tiny_target).render_chat([{"role": "user", "content": "x"}])


def test_the_endpoints_connections_send_without_waiting_for_acks():
    """Nagle off (TCP_NODELAY) on every accepted connection: with it on, a keep-alive client's delayed ACK held
    each response's body for 40 ms behind its headers. asyncio turns it off only on sockets that say they are TCP."""
    import asyncio
    import socket

    from trtspec.serving.openai_api.server import _bind

    async def nodelay_of_an_accepted_connection() -> int:
        accepted: asyncio.Future = asyncio.get_running_loop().create_future()

        def on_connection(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            accepted.set_result(writer.get_extra_info("socket").getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
            writer.close()

        server = await asyncio.start_server(on_connection, sock=_bind("127.0.0.1", 0))
        async with server:
            _, writer = await asyncio.open_connection(*server.sockets[0].getsockname()[:2])
            value = await asyncio.wait_for(accepted, 10)
            writer.close()
        return value

    assert asyncio.run(nodelay_of_an_accepted_connection()) != 0
