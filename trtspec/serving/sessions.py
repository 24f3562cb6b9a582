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
from trtspec.decoding.drafting import propose_locally
from trtspec.decoding.protocols import LanguageModel, LMSession, argmax_ids
from trtspec.decoding.types import Proposal, SamplingParams


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

    def run(
        self, session_id: str, token_ids: Sequence[int] | np.ndarray, num_logits: int, argmax: bool = False
    ) -> torch.Tensor:
        """Make ``session_id`` hold exactly ``token_ids``; float32 logits ``[num_logits, vocab]`` of its last
        positions, or with ``argmax`` their argmax ids ``[num_logits]`` (int64; through the session's
        ``forward_argmax`` where it has one)."""
        ids = self._check(token_ids, num_logits, extra=0)
        n = len(ids)
        entry, keep = self._sync(session_id, ids, n - num_logits)  # wanted positions must be fed
        try:
            out = self._feed(entry.session, ids[keep:].tolist(), num_logits, argmax)
        except Exception:
            # The cache's state is unknown now: drop it; the next call re-prefills.
            self._drop(session_id)
            raise
        entry.tokens = ids.copy()
        self.stats.tokens_fed += n - keep
        return out

    def _feed(self, session: LMSession, fresh: list[int], num_logits: int, argmax: bool) -> torch.Tensor:
        if not fresh:
            return torch.zeros((0,), dtype=torch.int64) if argmax else torch.zeros((0, self.lm.vocab_size))
        if not argmax:
            return session.forward(fresh, num_logits)  # [num_logits, vocab]
        return torch.tensor(argmax_ids(session, fresh, num_logits), dtype=torch.int64)

    def propose(
        self,
        session_id: str,
        token_ids: Sequence[int] | np.ndarray,
        k: int,
        sampling: SamplingParams,
        seed: int | None,
    ) -> Proposal:
        """Make ``session_id`` hold ``token_ids``, then draft ``k`` tokens after them in this process.

        The same procedure as the loop's local drafting
        (:func:`trtspec.decoding.drafting.propose_locally`); a sampled proposal draws
        from a generator seeded with ``seed``. Afterwards the cache holds
        ``token_ids`` plus the first ``k - 1`` proposed tokens.
        """
        if k < 1:
            raise InvalidRequestError(f"num_draft must be >= 1, got {k}")
        ids = self._check(token_ids, 1, extra=k)
        n = len(ids)
        entry, keep = self._sync(session_id, ids, n - 1)  # the last token is fed for the first logits
        gen = torch.Generator().manual_seed(seed) if seed is not None else None
        try:
            proposal = propose_locally(entry.session, ids[keep:].tolist(), k, sampling, gen, ids)
        except Exception:
            self._drop(session_id)
            raise
        entry.tokens = np.concatenate([ids, np.asarray(proposal.tokens[: k - 1], dtype=np.int64)])
        self.stats.tokens_fed += n - keep + k - 1
        return proposal

    def _check(self, token_ids: Sequence[int] | np.ndarray, num_logits: int, extra: int) -> np.ndarray:
        ids = np.asarray(token_ids, dtype=np.int64).reshape(-1)
        n = len(ids)
        if n == 0:
            raise InvalidRequestError("token_ids is empty")
        if not 0 <= num_logits <= n:
            raise InvalidRequestError(f"num_logits must be in [0, {n}] (the sequence length), got {num_logits}")
        if n + extra > self.lm.max_context:
            raise InvalidRequestError(
                f"sequence has {n + extra} tokens; this model's context holds {self.lm.max_context}"
            )
        vocab = self.lm.vocab_size
        if int(ids.min()) < 0 or int(ids.max()) >= vocab:
            raise InvalidRequestError(f"token ids must be in [0, {vocab})")
        return ids

    def _sync(self, session_id: str, ids: np.ndarray, max_keep: int) -> tuple[_Entry, int]:
        """The session's entry with its cache cut back to the common prefix with ``ids`` (at most ``max_keep``)."""
        self.stats.calls += 1
        entry = self._entries.get(session_id)
        if entry is None:
            self.stats.misses += 1
            entry = self._open(session_id)
        else:
            self.stats.hits += 1
            self._entries.move_to_end(session_id)
        keep = min(_common_prefix(entry.tokens, ids), max_keep)
        try:
            if keep < entry.session.num_cached:
                entry.session.truncate(keep)
        except Exception:
            self._drop(session_id)
            raise
        self.stats.tokens_reused += keep
        return entry, keep

    def cache_bytes(self) -> int:
        """KV-cache bytes held by all sessions (0 for runtimes that do not report it)."""
        return sum(_cache_bytes(e.session) for e in self._entries.values())

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


def _cache_bytes(session: object) -> int:
    """A session's ``cache_bytes``, looking through wrappers (fault injectors keep the real one in ``inner``)."""
    for _ in range(8):
        v = getattr(session, "cache_bytes", None)
        if v is not None:
            return int(v or 0)
        inner = getattr(session, "inner", None)
        if inner is None:
            return 0
        session = inner
    return 0


def _common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    m = min(len(a), len(b))
    if m == 0:
        return 0
    diff = np.flatnonzero(a[:m] != b[:m])
    return int(diff[0]) if len(diff) else m
