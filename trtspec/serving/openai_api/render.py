"""OpenAI response bodies (chat and text completions, whole and as stream chunks), as plain dicts.

Besides OpenAI's fields every response carries the extension ``trtspec`` on its
last choice-bearing body: ``{"num_draft_tokens", "num_accepted_tokens",
"acceptance_rate"}`` of the request (``acceptance_rate`` null when nothing was
drafted), the words and figures of ``spec_decode``'s outputs.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field

from trtspec.serving.client import ClientResult
from trtspec.serving.openai_api.schema import Usage

# spec_decode's finish reasons in OpenAI's words ("context": the context window is full)
FINISH_REASONS = {"length": "length", "stop": "stop", "context": "length"}


def usage(result: ClientResult) -> Usage:
    return Usage(prompt_tokens=result.num_input_tokens, completion_tokens=result.num_output_tokens)


def speculation_figures(result: ClientResult) -> dict:
    return {"num_draft_tokens": result.num_draft_tokens, "num_accepted_tokens": result.num_accepted_tokens,
            "acceptance_rate": result.acceptance_rate}


def sse(payload: dict | str) -> str:
    """One server-sent event."""
    return f"data: {payload if isinstance(payload, str) else json.dumps(payload, separators=(',', ':'))}\n\n"


@dataclass
class Renderer:
    """The bodies of one request: ``chat`` (``chat.completion``) or ``completions`` (``text_completion``)."""

    kind: str  # chat | completions
    model: str
    id: str = ""
    created: int = field(default_factory=lambda: int(time.time()))

    def __post_init__(self) -> None:
        assert self.kind in ("chat", "completions"), self.kind
        if not self.id:
            self.id = f"{'chatcmpl' if self.kind == 'chat' else 'cmpl'}-{uuid.uuid4().hex}"

    def _head(self, chunk: bool) -> dict:
        if self.kind == "chat":
            obj = "chat.completion.chunk" if chunk else "chat.completion"
        else:
            obj = "text_completion"
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}

    def body(self, result: ClientResult) -> dict:
        """The whole answer (``stream: false``)."""
        finish = FINISH_REASONS.get(result.finish_reason or "", "stop")
        if self.kind == "chat":
            choice = {"index": 0, "message": {"role": "assistant", "content": result.text},
                      "logprobs": None, "finish_reason": finish}
        else:
            choice = {"index": 0, "text": result.text, "logprobs": None, "finish_reason": finish}
        return {**self._head(False), "choices": [choice], "usage": usage(result).to_dict(),
                "trtspec": speculation_figures(result)}

    def chunk(self, text: str | None = None, *, role: bool = False, result: ClientResult | None = None,
              with_usage_field: bool = False) -> dict:
        """One stream chunk: new text, the opening role (chat), or the closing finish reason (``result``)."""
        finish = FINISH_REASONS.get(result.finish_reason or "", "stop") if result is not None else None
        if self.kind == "chat":
            delta: dict = {"role": "assistant", "content": ""} if role else ({} if text is None else {"content": text})
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        else:
            choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}
        out = {**self._head(True), "choices": [choice]}
        if result is not None:
            out["trtspec"] = speculation_figures(result)
        if with_usage_field:
            out["usage"] = None  # OpenAI: null on every chunk but the last when include_usage is on
        return out

    def usage_chunk(self, result: ClientResult) -> dict:
        """The last chunk with ``stream_options.include_usage``: no choices, the usage."""
        return {**self._head(True), "choices": [], "usage": usage(result).to_dict()}
