"""Fault injection for drafts: wrap a real :class:`~trtspec.decoding.protocols.LanguageModel`
so that every guard-rail path can be driven through the real loop (and, later,
by chaos tests against a running server).

- :class:`WrongTokenDraft` replaces a share of draft tokens with wrong ones;
- :class:`UnreliableDraft` adds delay to, or raises from, the draft's forward passes.

Both wrap the draft only. The loop's output never depends on the draft
(verification keeps only what the target would have produced), so greedy
output must stay identical to the target alone under any fault.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from trtspec.errors import DraftError
from trtspec.decoding.protocols import LanguageModel, LMSession
from trtspec.decoding.wrapping import ModelWrapper, SessionWrapper

if TYPE_CHECKING:
    import torch


class WrongTokenDraft(ModelWrapper):
    """A draft whose proposed token is replaced by a wrong one with probability ``share``.

    Each logits row the draft returns (one per proposed token) is, with
    probability ``share``, altered so that its argmax is a uniformly chosen
    token other than the draft's own choice: that token's logit is raised
    ``margin`` above the row's maximum. Greedy drafting then proposes it;
    sampled drafting draws it almost surely and reports the altered
    distribution as ``q``, so rejection sampling stays exact. Deterministic for
    a given ``seed``. ``injected`` / ``rows`` count what happened.
    """

    def __init__(self, inner: LanguageModel, share: float, seed: int = 0, margin: float = 50.0) -> None:
        super().__init__(inner)
        if not 0.0 <= share <= 1.0:
            raise ValueError(f"share must be in [0, 1], got {share}")
        self.share = share
        self.margin = margin
        self.rng = random.Random(seed)
        self.rows = 0
        self.injected = 0

    def new_session(self, session_id: str = "") -> LMSession:
        return _WrongTokenSession(self.inner.new_session(session_id), self)


class _WrongTokenSession(SessionWrapper):
    def __init__(self, inner: LMSession, owner: WrongTokenDraft) -> None:
        super().__init__(inner)
        self.owner = owner

    def forward(self, token_ids: Sequence[int], num_logits: int) -> torch.Tensor:
        logits = self.inner.forward(token_ids, num_logits)  # [num_logits, vocab]
        o = self.owner
        vocab = logits.shape[-1]
        out = None
        for i in range(num_logits):
            o.rows += 1
            if vocab < 2 or o.rng.random() >= o.share:
                continue
            if out is None:
                out = logits.clone()
            own = int(out[i].argmax())
            wrong = o.rng.randrange(vocab - 1)
            wrong += wrong >= own  # uniform over every token but the draft's own choice
            out[i, wrong] = out[i].max() + o.margin
            o.injected += 1
        return logits if out is None else out


class UnreliableDraft(ModelWrapper):
    """A draft that is slow or fails (or, slow only, a target: served, ``fault_delay_s``).

    Every ``forward`` first waits ``delay_s`` (through ``sleep``, so tests pass
    a fake clock's ``sleep``); then, once ``fail_after`` forwards have
    succeeded, raises :class:`~trtspec.errors.DraftError` with probability
    ``fail_share`` (1.0: every call from then on). The loop catches the error
    and continues the request on the target alone. ``calls`` / ``failures``
    count what happened.
    """

    def __init__(
        self,
        inner: LanguageModel,
        delay_s: float = 0.0,
        fail_share: float = 0.0,
        fail_after: int = 0,
        seed: int = 0,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        super().__init__(inner)
        if delay_s < 0:
            raise ValueError(f"delay_s must be >= 0, got {delay_s}")
        if not 0.0 <= fail_share <= 1.0:
            raise ValueError(f"fail_share must be in [0, 1], got {fail_share}")
        self.delay_s = delay_s
        self.fail_share = fail_share
        self.fail_after = fail_after
        self.sleep = sleep
        self.rng = random.Random(seed)
        self.calls = 0
        self.failures = 0

    def new_session(self, session_id: str = "") -> LMSession:
        return _UnreliableSession(self.inner.new_session(session_id), self)


class _UnreliableSession(SessionWrapper):
    def __init__(self, inner: LMSession, owner: UnreliableDraft) -> None:
        super().__init__(inner)
        self.owner = owner

    def forward(self, token_ids: Sequence[int], num_logits: int) -> torch.Tensor:
        o = self.owner
        o.calls += 1
        if o.delay_s > 0:
            o.sleep(o.delay_s)
        if o.calls > o.fail_after and o.fail_share > 0 and o.rng.random() < o.fail_share:
            o.failures += 1
            raise DraftError(f"injected draft failure (call {o.calls})")
        return self.inner.forward(token_ids, num_logits)
