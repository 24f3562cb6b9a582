"""OpenAI response bodies (chat and text completions, whole and as stream chunks), as plain dicts.

Besides OpenAI's fields every response carries the extension ``trtspec`` on its
last choice-bearing body: ``{"num_draft_tokens", "num_accepted_tokens",
"acceptance_rate"}`` of the request (``acceptance_rate`` null when nothing was
drafted), the words and figures of ``spec_decode``'s outputs.

With log-probabilities asked (``token_texts``: each token id's own text), a choice's
``logprobs`` holds one entry per generated token, the end-of-sequence token
included: chat ``{"content": [{"token", "logprob", "bytes", "top_logprobs": [{"token",
"logprob", "bytes"}, ...]}]}``, completions ``{"tokens", "token_logprobs", "top_logprobs":
[{token: logprob, ...}, ...] (null with logprobs 0), "text_offset"}``; streamed, each chunk
the tokens generated since the last.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import accumulate

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
    token_texts: Callable[[Sequence[int]], list[str]] | None = None  # set when log-probabilities are asked
    echoed: str = ""  # completions' echo: the prompt, before the answer's text
    _offset: int = 0  # completions' text_offset of the next token

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
        logprobs = self.logprobs(result.output_ids, result.logprobs or (), result.top_logprobs or ())
        if self.kind == "chat":
            choice = {"index": 0, "message": {"role": "assistant", "content": result.text},
                      "logprobs": logprobs, "finish_reason": finish}
        else:
            choice = {"index": 0, "text": self.echoed + result.text, "logprobs": logprobs, "finish_reason": finish}
        return {**self._head(False), "choices": [choice], "usage": usage(result).to_dict(),
                "trtspec": speculation_figures(result)}

    def chunk(self, text: str | None = None, *, role: bool = False, result: ClientResult | None = None,
              with_usage_field: bool = False, token_ids: Sequence[int] = (), logprobs: Sequence[float] = (),
              top: Sequence[Sequence[tuple[int, float]]] = ()) -> dict:
        """One stream chunk: new text (and its tokens' ``logprobs`` and ``top`` alternatives), the opening
        role (chat), or the closing finish reason (``result``)."""
        finish = FINISH_REASONS.get(result.finish_reason or "", "stop") if result is not None else None
        lp = self.logprobs(token_ids, logprobs, top) if token_ids else None
        if self.kind == "chat":
            delta: dict = {"role": "assistant", "content": ""} if role else ({} if text is None else {"content": text})
            choice = {"index": 0, "delta": delta, "logprobs": lp, "finish_reason": finish}
        else:
            choice = {"index": 0, "text": text or "", "logprobs": lp, "finish_reason": finish}
        out = {**self._head(True), "choices": [choice]}
        if result is not None:
            out["trtspec"] = speculation_figures(result)
        if with_usage_field:
            out["usage"] = None  # OpenAI: null on every chunk but the last when include_usage is on
        return out

    def opening(self, with_usage_field: bool = False) -> dict | None:
        """The chunk a stream opens with: chat's role; completions' echoed prompt (None: no echo)."""
        if self.kind == "chat":
            return self.chunk(role=True, with_usage_field=with_usage_field)
        return self.chunk(self.echoed, with_usage_field=with_usage_field) if self.echoed else None

    def logprobs(self, token_ids: Sequence[int], logprobs: Sequence[float],
                 top: Sequence[Sequence[tuple[int, float]]] = ()) -> dict | None:
        """A choice's ``logprobs`` for these tokens and each one's ``top`` alternatives (``(id, logprob)``,
        best first; () when not asked); None unless log-probabilities were asked for."""
        if self.token_texts is None:
            return None
        texts = self.token_texts(token_ids)
        alternatives = [list(zip(self.token_texts([i for i, _ in row]), (lp for _, lp in row))) for row in top]
        if self.kind == "chat":
            rows = alternatives or [[] for _ in texts]
            return {"content": [{**_entry(t, lp), "top_logprobs": [_entry(*alt) for alt in row]}
                                for t, lp, row in zip(texts, logprobs, rows)], "refusal": None}
        ends = list(accumulate((len(t) for t in texts), initial=self._offset))  # [len(texts) + 1]
        offsets, self._offset = ends[:-1], ends[-1]
        return {"tokens": texts, "token_logprobs": list(logprobs),
                "top_logprobs": [_by_text(row) for row in alternatives] if top else None, "text_offset": offsets}

    def usage_chunk(self, result: ClientResult) -> dict:
        """The last chunk with ``stream_options.include_usage``: no choices, the usage."""
        return {**self._head(True), "choices": [], "usage": usage(result).to_dict()}


def _by_text(row: list[tuple[str, float]]) -> dict[str, float]:
    """Completions' ``{token text: logprob}``, best first; two tokens of one text (pieces of a character
    both read U+FFFD) keep the better one."""
    out: dict[str, float] = {}
    for text, logprob in row:
        out.setdefault(text, logprob)
    return out


def _entry(text: str, logprob: float) -> dict:
    """One token of chat's ``logprobs.content`` (or of its ``top_logprobs``)."""
    return {"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8"))}
