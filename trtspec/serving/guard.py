"""A language model whose calls have a deadline and report how they went.

``spec_decode`` wraps its BLS proxies of ``draft`` and ``target`` in
:class:`GuardedModel`: each remote call runs on a thread pool and the request
thread waits for it at most the deadline of the moment; a late call is
abandoned (it finishes in the background, its result unused; should it then
fail, the hooks still hear of it) and ``late_error`` is raised in the request
thread. Every call is reported to the hooks, which is how the supervisor, the
breaker and the deadline estimator learn of the model's health without the
loop knowing of any of them.

The loop already turns any draft exception into "no draft" for the rest of
the request (no token lost or repeated), so for the draft a late call is a
degradation; for the target it is the request's error (``UNAVAILABLE``).

``close_async``: the session's ``close`` (a release call) is handed to the
pool and not waited for, so a slow or dead draft never delays the end of a
request. The release is queued behind the abandoned call, so the model frees
the session once it gets to it.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from concurrent.futures import Executor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any, Protocol, TypeVar

import torch

from trtspec.decoding.drafting import propose_locally
from trtspec.decoding.protocols import (
    ArgmaxForward, DraftProposer, DraftVerifier, LanguageModel, LMSession, has_capability,
)
from trtspec.decoding.types import Proposal, SamplingParams
from trtspec.decoding.wrapping import ModelWrapper, SessionWrapper
from trtspec.serving.deadline import Work

log = logging.getLogger("trtspec.serving.guard")

T = TypeVar("T")


class GuardHooks(Protocol):
    """Told of every call of a :class:`GuardedModel`. ``k``: tokens the call was to draft (0 otherwise);
    ``started_at``: ``time.monotonic()`` when the call was made (a failure may be reported long after);
    ``seconds``: the call's duration divided by ``1 +`` the calls that were running when it was made
    (the model serves one at a time: about the time of one call, whatever the load); ``work``: what
    the call asked when it was made."""

    def on_ok(self, seconds: float, work: Work) -> None: ...

    def on_late(self, k: int, deadline_s: float) -> None: ...

    def on_error(self, k: int, error: BaseException, started_at: float) -> None: ...

    def on_late_answer(self) -> None:
        """A call abandoned as late answered after all: the model is slow or busy, not dead."""
        ...


@dataclass
class _Call:
    started: float  # time.monotonic()
    tokens: int
    drafted: int  # of ``tokens``, those it drafts
    stuck_at: float  # past this, the call no longer counts as progress


class GuardedModel(ModelWrapper):
    """``inner`` with a per-call deadline and hooks.

    ``deadline(work)``: seconds the call may take (None: wait inline); ``stuck_after(work)``: how
    long a call may run before it no longer counts as progress (default: its deadline). The draft's
    deadline is short (a late proposal is worthless) while a late call may still be working; the
    target's two are the same. ``busy()`` tells the supervisor that the model has calls in flight
    that are still within ``stuck_after``: they are its liveness check, a probe would only queue
    behind them. ``prefill_chunk`` > 0: a forward pass of more new tokens is fed as calls of at most
    that many (all but the last without logits), so the model serves other requests' calls between
    them and each call's deadline stays bounded.
    """

    def __init__(
        self,
        inner: LanguageModel,
        pool: Executor,
        deadline: Callable[[Work], float | None],
        hooks: GuardHooks,
        *,
        late_error: Callable[[float], Exception],
        close_async: bool = False,
        stuck_after: Callable[[Work], float] | None = None,
        prefill_chunk: int = 0,
    ) -> None:
        if prefill_chunk < 0:
            raise ValueError(f"prefill_chunk must be >= 0, got {prefill_chunk}")
        super().__init__(inner)
        self.pool = pool
        self.deadline = deadline
        self.hooks = hooks
        self.late_error = late_error
        self.close_async = close_async
        self.stuck_after = stuck_after
        self.prefill_chunk = prefill_chunk
        self._calls: dict[int, _Call] = {}  # made and not finished (a late call runs on after it is abandoned)
        self._next_id = 0
        self._lock = threading.Lock()
        self.last_answer: float | None = None  # time.monotonic() of the last call that answered

    def new_session(self, session_id: str = "") -> GuardedSession:
        inner = self.inner.new_session(session_id)
        # A verifying target stays one (the loop asks ``has_capability(session, DraftVerifier)``).
        cls = GuardedVerifyingSession if has_capability(inner, DraftVerifier) else GuardedSession
        return cls(inner, self)

    def call(self, fn: Callable[[], T], k: int = 0, tokens: int = 1) -> T:
        """``fn()`` (a pass feeding ``tokens`` new tokens) under the deadline, reported to the hooks."""
        call_id, work, limit = self._begin(tokens, k)
        started = self._calls[call_id].started
        t0 = time.perf_counter()
        if limit is None:
            try:
                out = fn()
            except Exception as e:
                self._end(call_id, answered=False)
                self.hooks.on_error(k, e, started)
                raise
            self._end(call_id, answered=True)
        else:
            try:
                future = self.pool.submit(fn)
            except BaseException:
                self._end(call_id, answered=False)
                raise
            future.add_done_callback(lambda f: self._end(call_id, answered=_answered(f)))
            try:
                out = future.result(timeout=limit)
            except FutureTimeout:
                if not future.cancel():  # it runs on: if it then fails, the hooks still learn why
                    future.add_done_callback(lambda f: self._late_call_done(f, started))
                self.hooks.on_late(k, limit)
                raise self.late_error(limit) from None
            except Exception as e:
                self.hooks.on_error(k, e, started)
                raise
        self.hooks.on_ok((time.perf_counter() - t0) / (1 + work.calls_ahead), work)
        return out

    def _begin(self, tokens: int, drafted: int) -> tuple[int, Work, float | None]:
        """Register a call feeding ``tokens``, ``drafted`` of them drafted; its id, its work, and its deadline."""
        now = time.monotonic()
        with self._lock:
            ahead = list(self._calls.values())
            work = Work(tokens=tokens, calls_ahead=len(ahead), tokens_ahead=sum(c.tokens for c in ahead),
                        drafted=drafted, drafted_ahead=sum(c.drafted for c in ahead))
            limit = self.deadline(work)
            stuck_s = self.stuck_after(work) if self.stuck_after is not None else limit
            call_id = self._next_id
            self._next_id += 1
            self._calls[call_id] = _Call(now, tokens, drafted, now + stuck_s if stuck_s is not None else math.inf)
        return call_id, work, limit

    def _end(self, call_id: int, answered: bool) -> None:
        with self._lock:
            self._calls.pop(call_id, None)
            if answered:
                self.last_answer = time.monotonic()

    @property
    def running(self) -> int:
        """Calls made and not finished."""
        return len(self._calls)

    def busy(self) -> bool:
        """True while calls are in flight and none has run past its ``stuck_after``: the model is working."""
        now = time.monotonic()
        with self._lock:
            return bool(self._calls) and all(now < c.stuck_at for c in self._calls.values())

    def snapshot(self) -> dict:
        """In flight now and the last progress, for the status file."""
        now = time.monotonic()
        with self._lock:
            calls = list(self._calls.values())
            last = self.last_answer
        return {
            "in_flight": len(calls),
            "tokens_in_flight": sum(c.tokens for c in calls),
            "oldest_call_s": round(now - min(c.started for c in calls), 3) if calls else None,
            "stuck_calls": sum(1 for c in calls if now >= c.stuck_at),
            "last_answer_age_s": round(now - last, 3) if last is not None else None,
        }

    def _late_call_done(self, future: Any, started: float) -> None:
        """An abandoned call ended: a failure (a dead stub answers late with "not healthy") is
        reported with ``k = 0`` (its lateness was counted already); an answer says it is alive."""
        try:
            error = future.exception()
        except Exception:  # cancelled
            return
        try:
            if error is not None:
                self.hooks.on_error(0, error, started)
            else:
                self.hooks.on_late_answer()
        except Exception as e:
            log.warning("guard hook failed: %s", e)


def _answered(future: Any) -> bool:
    return not future.cancelled() and future.exception() is None


class GuardedSession(SessionWrapper):
    """One sequence of a :class:`GuardedModel` (an ``LMSession``, and a ``DraftProposer``)."""

    def __init__(self, inner: LMSession, owner: GuardedModel) -> None:
        super().__init__(inner)
        self._owner = owner

    def forward(self, token_ids: Sequence[int], num_logits: int) -> torch.Tensor:
        last = self._prefill(token_ids, num_logits)
        return self._owner.call(lambda: self.inner.forward(last, num_logits), tokens=len(last))

    def forward_argmax(self, token_ids: Sequence[int], num_logits: int) -> list[int]:
        """The inner session's ``forward_argmax`` where it has one, else ``forward`` and argmax here."""
        if has_capability(self.inner, ArgmaxForward):
            inner: Any = self.inner
            last = self._prefill(token_ids, num_logits)
            return self._owner.call(lambda: inner.forward_argmax(last, num_logits), tokens=len(last))
        return self.forward(token_ids, num_logits).argmax(dim=-1).tolist()

    def _prefill(self, token_ids: Sequence[int], num_logits: int) -> Sequence[int]:
        """Feed all but the last chunk of a long pass (``prefill_chunk`` tokens per call, no logits);
        the rest, which holds the ``num_logits`` wanted positions, is left for the caller's call."""
        chunk = self._owner.prefill_chunk
        n = len(token_ids)
        if chunk <= 0 or n <= chunk:
            return token_ids
        last = min((n - 1) // chunk * chunk, n - num_logits)  # the last call has 1..chunk tokens, and the logits
        for start in range(0, last, chunk):
            piece = token_ids[start : min(start + chunk, last)]
            self._owner.call(lambda p=piece: self.inner.forward(p, 0), tokens=len(piece))
        return token_ids[last:]

    def propose(self, token_ids: Sequence[int], k: int, sampling: SamplingParams, seed: int | None,
                text: Sequence[int] = ()) -> Proposal:
        if has_capability(self.inner, DraftProposer):
            inner: Any = self.inner
            return self._owner.call(lambda: inner.propose(token_ids, k, sampling, seed, text), k=k,
                                    tokens=len(token_ids) + k)
        # A local draft: one deadline per forward pass.
        gen = torch.Generator().manual_seed(seed) if seed is not None else None
        return propose_locally(self, token_ids, k, sampling, gen, text)

    def close(self) -> None:
        if self._owner.close_async:
            self._owner.pool.submit(_close_quietly, self.inner)
        else:
            self._owner.call(self.inner.close, tokens=0)


def _close_quietly(session: LMSession) -> None:
    try:
        session.close()
    except Exception as e:  # best effort: LRU eviction frees it otherwise
        log.debug("release failed: %s", e)


class GuardedVerifyingSession(GuardedSession):
    """A :class:`GuardedSession` of a session that verifies drafts itself (a ``DraftVerifier``)."""

    def verify(
        self, token_ids: Sequence[int], drafted: Sequence[int], sampling: SamplingParams, seed: int | None
    ) -> tuple[int, int]:
        inner: Any = self.inner
        return self._owner.call(lambda: inner.verify(token_ids, drafted, sampling, seed),
                                 tokens=len(token_ids) + len(drafted))
