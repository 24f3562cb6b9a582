"""Per-sequence KV caches of one served model, keyed by session id, evicted LRU.

This is the model side of the draft/target BLS protocol (``protocol.LM_INPUTS``):
each call names the WHOLE sequence the cache should hold afterwards. The store
keeps the longest common prefix of what the session's cache holds and the
sequence asked for (cutting the cache back is the rollback), feeds the rest in
one forward pass and returns the logits of the last ``num_logits`` positions.
An unknown or evicted session starts from an empty cache (a full re-prefill):
a miss costs time, never correctness.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from trtspec.errors import InvalidRequestError
from trtspec.spec.protocols import LanguageModel, LMSession


@dataclass
class StoreStats:
    calls: int = 0
    hits: int = 0  # calls that found their session's cache
    misses: int = 0  # calls that had to start a fresh cache (new, evicted or failed session)
    evictions: int = 0
    releases: int = 0
    tokens_fed: int = 0  # tokens run through the model
    tokens_reused: int = 0  # tokens served from a cache (the kept common prefix)


@dataclass
class _Entry:
    session: LMSession
    tokens: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))  # [num_cached]


class SessionStore:
    """KV caches of up to ``max_sessions`` sequences on one :class:`LanguageModel`."""

    def __init__(self, lm: LanguageModel, max_sessions: int) -> None:
        if max_sessions < 1:
            raise ValueError(f"max_sessions must be >= 1, got {max_sessions}")
        self.lm = lm
        self.max_sessions = max_sessions
        self._entries: OrderedDict[str, _Entry] = OrderedDict()  # least recently used first
        self.stats = StoreStats()

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, session_id: str) -> bool:
        return session_id in self._entries

    def cached_tokens(self, session_id: str) -> int:
        e = self._entries.get(session_id)
        return len(e.tokens) if e is not None else 0

    def run(self, session_id: str, token_ids: Sequence[int] | np.ndarray, num_logits: int) -> torch.Tensor:
        """Make ``session_id`` hold exactly ``token_ids``; float32 logits ``[num_logits, vocab]`` of its last positions."""
        ids = np.asarray(token_ids, dtype=np.int64).reshape(-1)
        n = len(ids)
        if n == 0:
            raise InvalidRequestError("token_ids is empty")
        if not 0 <= num_logits <= n:
            raise InvalidRequestError(f"num_logits must be in [0, {n}] (the sequence length), got {num_logits}")
        if n > self.lm.max_context:
            raise InvalidRequestError(f"sequence has {n} tokens; this model's context holds {self.lm.max_context}")
        vocab = self.lm.vocab_size
        if int(ids.min()) < 0 or int(ids.max()) >= vocab:
            raise InvalidRequestError(f"token ids must be in [0, {vocab})")
        self.stats.calls += 1
        entry = self._entries.get(session_id)
        if entry is None:
            self.stats.misses += 1
            entry = self._open(session_id)
        else:
            self.stats.hits += 1
            self._entries.move_to_end(session_id)
        keep = _common_prefix(entry.tokens, ids)
        # Positions whose logits are wanted must be fed: keep at most n - num_logits.
        keep = min(keep, n - num_logits)
        try:
            if keep < entry.session.num_cached:
                entry.session.truncate(keep)
            if keep < n:
                logits = entry.session.forward(ids[keep:].tolist(), num_logits)  # [num_logits, vocab]
            else:
                logits = torch.zeros((0, vocab), dtype=torch.float32)
        except Exception:
            # The cache's state is unknown now: drop it; the next call re-prefills.
            self._drop(session_id)
            raise
        entry.tokens = ids.copy()
        self.stats.tokens_fed += n - keep
        self.stats.tokens_reused += keep
        return logits

    def release(self, session_id: str) -> bool:
        """Free ``session_id``'s cache; False if it held none."""
        if session_id not in self._entries:
            return False
        self._drop(session_id)
        self.stats.releases += 1
        return True

    def clear(self) -> None:
        for sid in list(self._entries):
            self._drop(sid)

    def _open(self, session_id: str) -> _Entry:
        while len(self._entries) >= self.max_sessions:
            oldest = next(iter(self._entries))
            self._drop(oldest)
            self.stats.evictions += 1
        entry = _Entry(self.lm.new_session(session_id))
        self._entries[session_id] = entry
        return entry

    def _drop(self, session_id: str) -> None:
        entry = self._entries.pop(session_id, None)
        if entry is not None:
            try:
                entry.session.close()
            except Exception:  # freeing must not fail the call that evicts
                pass


def _common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    m = min(len(a), len(b))
    if m == 0:
        return 0
    diff = np.flatnonzero(a[:m] != b[:m])
    return int(diff[0]) if len(diff) else m
