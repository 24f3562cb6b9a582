"""The OpenAI request bodies we take, and how each becomes one ``spec_decode`` request.

Field names, types and defaults are OpenAI's (``temperature`` and ``top_p``
default to 1, as there). A field we cannot honour with a value other than its
neutral one (``n`` > 1, tools, ...) is refused with a
400 naming it; ``logprobs`` (chat: true, with ``top_logprobs`` 0..20; completions:
0..5) gives each generated token's log-probability and the most likely tokens',
as ``spec_decode``'s ``return_log_probs`` and ``top_logprobs`` do; fields we do
not know are ignored, as OpenAI's own server ignores them. Extensions, sent by the OpenAI SDK through ``extra_body``:
``speculation`` (``auto | on | off``), ``priority`` (``high | normal | low``),
``drafter`` (``model | ngram | suffix | auto``) and ``top_k``; and vLLM's
``ignore_eos`` (what ``vllm bench serve --ignore-eos`` and other load generators
send for answers of ``max_tokens`` tokens), ``min_tokens`` (no EOS among the
first tokens), ``bad_words`` and ``repetition_penalty``. Every penalty is
``spec_decode``'s, TensorRT-LLM's (as ``trtllm-serve`` forwards them): occurrences
are counted over the prompt and the answer, where OpenAI and vLLM count presence
and frequency over the answer only (docs/serving.md).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from trtspec.decoding.types import DrafterKind, LogitBias, Penalties
from trtspec.serving.client import GenerateParams
from trtspec.wire import Priority, Speculation

COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions; chat's is as many as the server allows


class OpenAIError(Exception):
    """A request we answer with OpenAI's error JSON and this HTTP status."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code

    def body(self) -> dict:
        kind = {499: "cancelled", 503: "service_unavailable_error"}.get(
            self.status, "invalid_request_error" if 400 <= self.status < 500 else "server_error")
        return {"error": {"message": self.message, "type": kind, "param": self.param, "code": self.code}}


class StreamOptions(BaseModel):
    include_usage: bool = False


class _Request(BaseModel):
    """What chat and completions requests share."""

    model_config = ConfigDict(extra="ignore")

    model: str
    max_tokens: int | None = Field(None, ge=1)
    temperature: float = Field(1.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    seed: int | None = Field(None, ge=0, lt=2**64)
    stop: str | list[str] | None = None
    n: int = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    presence_penalty: float = Field(0.0, ge=-2.0, le=2.0)  # OpenAI's range
    frequency_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    logit_bias: dict[str, float] | None = None
    # extensions (extra_body)
    speculation: Speculation | None = None
    priority: Priority | None = None
    drafter: DrafterKind | None = None
    top_k: int | None = Field(None, ge=0)
    ignore_eos: bool = False  # vLLM's: EOS does not end the answer (spec_decode's end_id -1)
    repetition_penalty: float = Field(1.0, gt=0.0)  # vLLM's
    min_tokens: int = Field(0, ge=0)  # vLLM's: no EOS among the first this many tokens (spec_decode's min_tokens)
    bad_words: list[str] | None = None  # vLLM's: words the text never contains (spec_decode's bad_words)

    def bias(self) -> LogitBias:
        """OpenAI's ``logit_bias`` (token id, as a string -> -100..100) as spec_decode's logit bias."""
        bias = self.logit_bias or {}
        bad = next((k for k in bias if not k.strip().isdigit()), None)
        if bad is not None:
            raise OpenAIError(400, f"logit_bias: {bad!r} is not a token id", "logit_bias")
        out = next((v for v in bias.values() if not -100 <= v <= 100), None)
        if out is not None:
            raise OpenAIError(400, f"logit_bias: {out} is outside -100..100", "logit_bias")
        return LogitBias.of((int(k), v) for k, v in bias.items())

    @property
    def wants_logprobs(self) -> bool:
        """Each generated token's log-probability asked for (chat: ``logprobs``; completions: ``logprobs``)."""
        return False

    @property
    def num_top_logprobs(self) -> int:
        """How many of the most likely tokens at each position besides (chat: ``top_logprobs``;
        completions: ``logprobs``)."""
        return 0

    def refuse_unsupported(self) -> None:
        """400 for each field set to something we cannot do (the neutral values pass)."""
        if self.n != 1:
            raise OpenAIError(400, f"n {self.n}: this server returns one choice per request (n = 1)", "n")
        self.bias()  # a logit_bias that is not OpenAI's shape: refused here
        if self.stream_options is not None and not self.stream:
            raise OpenAIError(400, "stream_options is only allowed when stream is true", "stream_options")
        for param, text in self._texts():  # JSON can carry a lone surrogate ("\ud800"); UTF-8 cannot
            try:
                text.encode("utf-8")
            except UnicodeEncodeError as e:
                raise OpenAIError(400, f"{param} is not valid text: {e.reason} (character {e.start})", param) from None

    def _texts(self) -> Iterator[tuple[str, str]]:
        """Each text of the request, with the field it came in."""
        yield from ((f"stop.{i}", t) for i, t in enumerate(self._stops()))
        yield from ((f"bad_words.{i}", t) for i, t in enumerate(self.bad_words or ()))

    def _stops(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or ())

    def params(self, max_tokens: int | None, default_max_tokens: int, apply_chat_template: bool) -> GenerateParams:
        return GenerateParams(
            max_tokens=max_tokens or default_max_tokens,
            temperature=self.temperature,
            top_k=self.top_k,
            top_p=self.top_p,
            seed=self.seed,
            stop_words=self._stops(),
            bad_words=tuple(self.bad_words or ()),
            speculation=self.speculation.value if self.speculation is not None else None,
            priority=self.priority.value if self.priority is not None else None,
            drafter=self.drafter.value if self.drafter is not None else None,
            apply_chat_template=apply_chat_template,
            end_id=-1 if self.ignore_eos else None,
            min_tokens=self.min_tokens or None,
            penalties=Penalties(self.repetition_penalty, self.presence_penalty, self.frequency_penalty),
            logit_bias=self.bias(),
            logprobs=self.wants_logprobs,
            top_logprobs=self.num_top_logprobs,
        )

    @property
    def echoed(self) -> str:
        """What the answer's text opens with (completions' ``echo``: the prompt)."""
        return ""

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage


class ContentPart(BaseModel):
    model_config = ConfigDict(extra="ignore")

    type: str
    text: str | None = None


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[ContentPart] | None = None

    def text(self) -> str:
        if self.content is None or isinstance(self.content, str):
            return self.content or ""
        kinds = {p.type for p in self.content} - {"text"}
        if kinds:
            raise OpenAIError(400, f"message content of type {sorted(kinds)[0]!r} is not supported (text only)",
                              "messages")
        return "".join(p.text or "" for p in self.content)


class ChatCompletionRequest(_Request):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)  # OpenAI's range
    tools: list[Any] | None = None
    response_format: dict[str, Any] | None = None

    @property
    def wants_logprobs(self) -> bool:
        return self.logprobs

    @property
    def num_top_logprobs(self) -> int:
        return self.top_logprobs or 0

    def refuse_unsupported(self) -> None:
        super().refuse_unsupported()
        if self.top_logprobs and not self.logprobs:
            raise OpenAIError(400, f"top_logprobs {self.top_logprobs} needs logprobs true", "top_logprobs")
        if self.tools:
            raise OpenAIError(400, "tools are not supported by this server", "tools")
        if self.response_format and self.response_format.get("type", "text") != "text":
            raise OpenAIError(400, f"response_format {self.response_format.get('type')!r}: text only", "response_format")

    def _texts(self) -> Iterator[tuple[str, str]]:
        yield from super()._texts()
        yield from ((f"messages.{i}.content", m.text()) for i, m in enumerate(self.messages))

    def chat(self) -> list[dict[str, str]]:
        """The messages as the chat template takes them (``developer`` is OpenAI's newer name for ``system``)."""
        return [{"role": "system" if m.role == "developer" else m.role, "content": m.text()} for m in self.messages]

    @property
    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens


class CompletionRequest(_Request):
    prompt: str | list[str] | list[int] | list[list[int]]  # OpenAI takes token ids too: refused by name
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = None
    logprobs: int | None = Field(None, ge=0, le=5)  # OpenAI's range: the top alternatives besides the token

    @property
    def wants_logprobs(self) -> bool:
        return self.logprobs is not None

    @property
    def num_top_logprobs(self) -> int:
        return self.logprobs or 0

    def refuse_unsupported(self) -> None:
        super().refuse_unsupported()
        if isinstance(self.prompt, list) and any(not isinstance(p, str) for p in self.prompt):
            raise OpenAIError(400, "prompt as token ids is not supported by this server; send it as text", "prompt")
        if isinstance(self.prompt, list) and len(self.prompt) != 1:
            raise OpenAIError(400, f"prompt holds {len(self.prompt)} strings; this server takes one prompt per request",
                              "prompt")
        if self.suffix not in (None, ""):
            raise OpenAIError(400, "suffix is not supported by this server", "suffix")
        if self.echo and self.logprobs is not None:
            raise OpenAIError(400, "echo with logprobs asks the prompt's log-probabilities, which this server does "
                                   "not compute; send one or the other", "echo")
        if self.best_of not in (None, 1):
            raise OpenAIError(400, f"best_of {self.best_of}: this server returns one choice per request", "best_of")

    def _texts(self) -> Iterator[tuple[str, str]]:
        yield from super()._texts()
        prompts = [self.prompt] if isinstance(self.prompt, str) else self.prompt
        yield from (("prompt", p) for p in prompts if isinstance(p, str))

    def text(self) -> str:
        return self.prompt if isinstance(self.prompt, str) else self.prompt[0]

    @property
    def echoed(self) -> str:
        """What the answer's text opens with: the prompt under ``echo``, else nothing."""
        return self.text() if self.echo else ""

    @property
    def requested_max_tokens(self) -> int | None:
        return COMPLETIONS_DEFAULT_MAX_TOKENS if self.max_tokens is None else self.max_tokens


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int

    def to_dict(self) -> dict:
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                "total_tokens": self.prompt_tokens + self.completion_tokens}
