"""Small in-memory language models for testing the loop without weights.

``BigramLM``: next-token logits depend only on the last token (a ``[vocab,
vocab]`` table), so exact target distributions are known in closed form. It
implements :class:`~trtspec.decoding.protocols.LanguageModel` and counts calls, so
tests can check that verification is ONE forward pass and that rollback
happens.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from trtspec.decoding.wrapping import ModelWrapper, SessionWrapper


@dataclass
class CallLog:
    forwards: list[tuple[int, int]] = field(default_factory=list)  # (tokens fed, num_logits)
    truncates: list[int] = field(default_factory=list)
    sessions_opened: int = 0
    sessions_closed: int = 0


class BigramSession:
    def __init__(self, model: BigramLM) -> None:
        self._model = model
        self.tokens: list[int] = []
        self.closed = False

    @property
    def num_cached(self) -> int:
        return len(self.tokens)

    def forward(self, token_ids: Sequence[int], num_logits: int) -> torch.Tensor:
        assert not self.closed, "forward on a closed session"
        assert len(token_ids) > 0
        self._model.log.forwards.append((len(token_ids), num_logits))
        self.tokens.extend(int(t) for t in token_ids)
        if len(self.tokens) > self._model.max_context:
            raise ValueError("context overflow")
        last = torch.tensor(self.tokens[len(self.tokens) - num_logits :], dtype=torch.int64)
        return self._model.table[last].clone()  # [num_logits, vocab]

    def truncate(self, length: int) -> None:
        assert 0 <= length <= len(self.tokens)
        self._model.log.truncates.append(length)
        del self.tokens[length:]

    def close(self) -> None:
        self.closed = True
        self._model.log.sessions_closed += 1


class BigramLM:
    """``table[prev]`` are the logits of the token after ``prev``."""

    def __init__(self, table: torch.Tensor, max_context: int = 4096) -> None:
        assert table.dim() == 2 and table.shape[0] == table.shape[1]
        self.table = table.float()
        self._max_context = max_context
        self.log = CallLog()

    @classmethod
    def random(cls, vocab: int, seed: int, sharpness: float = 3.0, max_context: int = 4096) -> BigramLM:
        g = torch.Generator().manual_seed(seed)
        return cls(torch.randn(vocab, vocab, generator=g) * sharpness, max_context=max_context)

    @classmethod
    def cycle(cls, vocab: int, step: int = 1, max_context: int = 4096) -> BigramLM:
        """Greedy continuation of ``t`` is ``(t + step) % vocab``: a predictable sequence."""
        table = torch.full((vocab, vocab), -10.0)
        for t in range(vocab):
            table[t, (t + step) % vocab] = 10.0
        return cls(table, max_context=max_context)

    @property
    def vocab_size(self) -> int:
        return self.table.shape[0]

    @property
    def max_context(self) -> int:
        return self._max_context

    def new_session(self, session_id: str = "") -> BigramSession:
        self.log.sessions_opened += 1
        return BigramSession(self)


class FailingLM(ModelWrapper):
    """Wraps a model; its sessions raise after ``fail_after`` forward calls (a dying draft)."""

    def __init__(self, inner: BigramLM, fail_after: int) -> None:
        super().__init__(inner)
        self.fail_after = fail_after
        self.calls = 0

    def new_session(self, session_id: str = "") -> _FailingSession:
        return _FailingSession(self, self.inner.new_session(session_id))


class _FailingSession(SessionWrapper):
    def __init__(self, owner: FailingLM, inner: BigramSession) -> None:
        super().__init__(inner)
        self._owner = owner

    def forward(self, token_ids: Sequence[int], num_logits: int) -> torch.Tensor:
        self._owner.calls += 1
        if self._owner.calls > self._owner.fail_after:
            raise RuntimeError("draft process died")
        return self.inner.forward(token_ids, num_logits)


class CharDetokenizer:
    """Token ``i`` decodes to ``alphabet[i % len(alphabet)]``; ids in ``special`` decode to ''."""

    def __init__(self, alphabet: str = "abcdefghijklmnopqrstuvwxyz", special: frozenset[int] = frozenset()) -> None:
        self.alphabet = alphabet
        self.special = special

    def decode(self, token_ids: Sequence[int]) -> str:
        return "".join(self.alphabet[t % len(self.alphabet)] for t in token_ids if t not in self.special)
