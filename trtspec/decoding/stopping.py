"""Stop conditions and incremental text for streaming.

Tokens are offered one at a time; the first one that triggers a stop is the
last one kept, and anything after it (even if the target accepted it in the
same iteration) is dropped. Text that could still turn out to be the start of
a stop string is held back until it is known not to be.
"""

from __future__ import annotations

from collections.abc import Sequence

from trtspec.decoding.protocols import Detokenizer
from trtspec.decoding.types import FinishReason, StopCriteria

REDECODED = 6  # tokens before the new ones decoded again: room for a decoder's joins (a space, a split character)


class IncrementalText:
    """``detokenizer.decode(ids)`` of a token list that only grows, without decoding all of it each time.

    Decoding the whole output at every iteration costs O(n) (0.45 ms at 2,048 tokens with the demo's
    tokenizer on a 2-core EPYC; once per offered token with stop strings), so a long request paid O(n^2).
    The text of the first ``settled`` tokens is kept; a call decodes from :data:`REDECODED` tokens before
    them to the end, and to ``settled``, and appends what the first adds to the second. Where the first
    does not start with the second (a decoder joining across the boundary) it decodes everything, as
    before. The settled point moves only to a text that does not end in an incomplete character.
    """

    def __init__(self, detokenizer: Detokenizer) -> None:
        self._detok = detokenizer
        self._settled = 0
        self._settled_text = ""

    def of(self, ids: Sequence[int]) -> str:
        if len(ids) == self._settled:  # asked again (the stop-string check, then the stream)
            return self._settled_text
        start = max(0, self._settled - REDECODED)
        head = self._detok.decode(ids[start : self._settled]) if start < self._settled else ""
        tail = self._detok.decode(ids[start:])
        text = self._settled_text + tail[len(head) :] if tail.startswith(head) else self._detok.decode(ids)
        if not text.endswith("\ufffd"):
            self._settled, self._settled_text = len(ids), text
        return text


class StopChecker:
    """Tracks the generated tokens and text of one request."""

    def __init__(self, criteria: StopCriteria, detokenizer: Detokenizer | None) -> None:
        if criteria.stop_strings and detokenizer is None:
            raise ValueError("stop strings need a detokenizer")
        self._criteria = criteria
        self._text_of = IncrementalText(detokenizer).of if detokenizer is not None else None
        self._ids: list[int] = []
        self._text = ""  # decoded text of _ids, cut at a stop string if one matched
        self._streamed = 0  # characters of _text already handed out
        self._max_stop_len = max((len(s) for s in criteria.stop_strings), default=0)
        self.finish_reason: FinishReason | None = None

    @property
    def token_ids(self) -> list[int]:
        return self._ids

    @property
    def done(self) -> bool:
        return self.finish_reason is not None

    def offer(self, token: int) -> bool:
        """Append ``token``; return True if generation must stop after it."""
        assert not self.done, "offer() after a stop"
        self._ids.append(token)
        c = self._criteria
        if token in c.eos_token_ids or token in c.stop_token_ids:
            self.finish_reason = FinishReason.STOP  # exit: EOS or stop token id
        elif c.stop_strings and self._match_stop_string():
            self.finish_reason = FinishReason.STOP  # exit: stop string
        elif len(self._ids) >= c.max_new_tokens:
            self.finish_reason = FinishReason.LENGTH  # exit: max new tokens
        return self.done

    def finish(self, reason: FinishReason) -> None:
        """End for a reason outside the tokens (context full, cancellation)."""
        if self.finish_reason is None:
            self.finish_reason = reason

    def _decode(self) -> str:
        return self._text_of(self._ids) if self._text_of is not None else ""

    def _match_stop_string(self) -> bool:
        text = self._decode()
        start = max(0, len(self._text) - self._max_stop_len)
        hits = [i for s in self._criteria.stop_strings if (i := text.find(s, start)) >= 0]
        if hits:
            self._text = text[: min(hits)]
            return True
        self._text = text
        return False

    def text(self) -> str:
        """The whole output text so far (stop string excluded)."""
        if not (self._criteria.stop_strings and self.done):
            self._text = self._decode()
        return self._text

    def take_new_text(self) -> str:
        """Text not handed out yet that is safe to hand out now."""
        text = self.text()
        end = len(text)
        if not self.done:
            end -= self._unsafe_suffix(text)
        if end <= self._streamed:
            return ""
        new = text[self._streamed : end]
        self._streamed = end
        return new

    def _unsafe_suffix(self, text: str) -> int:
        """Length of the tail that must wait: an incomplete UTF-8 character, or
        a suffix that is a prefix of some stop string."""
        hold = 0
        if text.endswith("\ufffd"):
            hold = len(text) - len(text.rstrip("\ufffd"))
        for s in self._criteria.stop_strings:
            for n in range(min(len(s) - 1, len(text)), 0, -1):
                if text.endswith(s[:n]):
                    hold = max(hold, n)
                    break
        return hold
