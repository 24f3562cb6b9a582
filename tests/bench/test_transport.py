"""What each transport puts on the wire for one request: the arm, priority and drafter (no server)."""

from __future__ import annotations

import asyncio

import pytest

from trtspec.bench import transport
from trtspec.bench.records import RequestRecord
from trtspec.bench.workload import RequestSpec

SPEC = RequestSpec(0, "hello", 8, "auto", "high", "ngram")
OFF = RequestSpec(1, "hello", 8, "off")


class Sent(Exception):
    """Raised by the fakes with what would have been sent."""


def _send(t, spec: RequestSpec) -> dict:
    rec = RequestRecord(spec.index, spec.arm, spec.max_tokens, 0.0)
    with pytest.raises(Sent) as e:
        asyncio.run(t.send(spec, rec, lambda: 0.0, 5.0))
    return e.value.args[0]


def test_grpc_inputs_carry_the_drafter() -> None:
    inputs = {i.name(): i._get_content() for i in transport._grpc_inputs(SPEC)}
    assert inputs["drafter"] == b"\x05\x00\x00\x00ngram"  # BYTES: length-prefixed
    assert inputs["speculation"] == b"\x04\x00\x00\x00auto"
    assert "drafter" not in {i.name() for i in transport._grpc_inputs(OFF)}


def test_http_body_carries_the_drafter(monkeypatch: pytest.MonkeyPatch) -> None:
    def fake_generate_http(url, prompt, params, **_):
        raise Sent(params.fields())

    monkeypatch.setattr(transport, "generate_http", fake_generate_http)
    t = transport.HttpTransport("localhost:1", threads=1)
    try:
        assert _send(t, SPEC) == {"max_tokens": 8, "speculation": "auto", "priority": "high", "drafter": "ngram"}
        assert "drafter" not in _send(t, OFF)
    finally:
        asyncio.run(t.close())


def test_openai_extra_body_carries_the_drafter() -> None:
    t = transport.OpenAITransport("localhost:1", model="spec_decode")  # named: the fake lists no models

    class Completions:
        async def create(self, **kwargs):
            raise Sent(kwargs)

    t._client = type("Client", (), {"chat": type("Chat", (), {"completions": Completions()})()})()
    sent = _send(t, SPEC)
    assert sent["extra_body"] == {"speculation": "auto", "priority": "high", "drafter": "ngram"}
    assert sent["max_tokens"] == 8
    assert _send(t, OFF)["extra_body"] == {"speculation": "off"}


@pytest.mark.parametrize(("env", "key"), [("k3y", "k3y"), (None, "unused")])
def test_the_openai_transport_sends_the_sdks_key_from_the_environment(monkeypatch, env, key):
    # a server started with --openai-api-key asks for it; the SDK's convention is $OPENAI_API_KEY
    if env is None:
        monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    else:
        monkeypatch.setenv("OPENAI_API_KEY", env)
    assert transport.OpenAITransport("127.0.0.1:1")._client.api_key == key
