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
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any, Protocol, TypeVar

import torch

from trtspec.spec.drafting import propose_locally
from trtspec.spec.protocols import ArgmaxForward, DraftProposer, DraftVerifier, LanguageModel, LMSession
from trtspec.spec.types import Proposal, SamplingParams

log = logging.getLogger("trtspec.serving.guard")

T = TypeVar("T")


class GuardHooks(Protocol):
    """Told of every call of a :class:`GuardedModel`. ``k``: tokens the call was to draft (0 otherwise);
    ``started_at``: ``time.monotonic()`` when the call was made (a failure may be reported long after);
    ``seconds``: the call's duration divided by ``1 +`` the calls that were running when it was made
    (the model serves one at a time: about the time of one call, whatever the load)."""

    def on_ok(self, seconds: float) -> None: ...

    def on_late(self, k: int, deadline_s: float) -> None: ...

    def on_error(self, k: int, error: BaseException, started_at: float) -> None: ...


class GuardedModel:
    """``inner`` with a per-call deadline and hooks. ``deadline(ahead)``: seconds the call may take
    (None: wait inline), ``ahead`` the model's calls still running (abandoned late ones included)."""

    def __init__(
        self,
        inner: LanguageModel,
        pool: Executor,
        deadline: Callable[[int], float | None],
        hooks: GuardHooks,
        *,
        late_error: Callable[[float], Exception],
        close_async: bool = False,
    ) -> None:
        self.inner = inner
        self.pool = pool
        self.deadline = deadline
        self.hooks = hooks
        self.late_error = late_error
        self.close_async = close_async
        self._running = 0  # calls made and not finished (a late call runs on after it is abandoned)
        self._running_lock = threading.Lock()

    @property
    def vocab_size(self) -> int:
        return self.inner.vocab_size

    @property
    def max_context(self) -> int:
        return self.inner.max_context

    def new_session(self, session_id: str = "") -> GuardedSession:
        inner = self.inner.new_session(session_id)
        # A verifying target stays one (the loop asks ``isinstance(session, DraftVerifier)``).
        cls = GuardedVerifyingSession if isinstance(inner, DraftVerifier) else GuardedSession
        return cls(inner, self)

    def call(self, fn: Callable[[], T], k: int = 0) -> T:
        """``fn()`` under the deadline, reported to the hooks."""
        with self._running_lock:
            ahead = self._running
            self._running += 1
        try:
            limit = self.deadline(ahead)
        except BaseException:
            self._finished()
            raise
        started = time.monotonic()
        t0 = time.perf_counter()
        if limit is None:
            try:
                out = fn()
            except Exception as e:
                self.hooks.on_error(k, e, started)
                raise
            finally:
                self._finished()
        else:
            try:
                future = self.pool.submit(fn)
            except BaseException:
                self._finished()
                raise
            future.add_done_callback(lambda f: self._finished())
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
        self.hooks.on_ok((time.perf_counter() - t0) / (1 + ahead))
        return out

    def _finished(self) -> None:
        with self._running_lock:
            self._running -= 1

    @property
    def running(self) -> int:
        """Calls made and not finished."""
        return self._running

    def _late_call_done(self, future: Any, started: float) -> None:
        """An abandoned call ended: a failure (a dead stub answers late with "not healthy") is
        reported with ``k = 0`` (its lateness was counted already)."""
        try:
            error = future.exception()
        except Exception:  # cancelled
            return
        if error is not None:
            try:
                self.hooks.on_error(0, error, started)
            except Exception as e:
                log.warning("guard hook failed: %s", e)


class GuardedSession:
    """One sequence of a :class:`GuardedModel` (an ``LMSession``, and a ``DraftProposer``)."""

    def __init__(self, inner: LMSession, owner: GuardedModel) -> None:
        self.inner = inner
        self._owner = owner

    @property
    def num_cached(self) -> int:
        return self.inner.num_cached

    def forward(self, token_ids: Sequence[int], num_logits: int) -> torch.Tensor:
        return self._owner.call(lambda: self.inner.forward(token_ids, num_logits))

    def forward_argmax(self, token_ids: Sequence[int], num_logits: int) -> list[int]:
        """The inner session's ``forward_argmax`` where it has one, else ``forward`` and argmax here."""
        if isinstance(self.inner, ArgmaxForward):
            inner: Any = self.inner
            return self._owner.call(lambda: inner.forward_argmax(token_ids, num_logits))
        return self.forward(token_ids, num_logits).argmax(dim=-1).tolist()

    def propose(self, token_ids: Sequence[int], k: int, sampling: SamplingParams, seed: int | None) -> Proposal:
        if isinstance(self.inner, DraftProposer):
            inner: Any = self.inner
            return self._owner.call(lambda: inner.propose(token_ids, k, sampling, seed), k=k)
        # A local draft: one deadline per forward pass.
        gen = torch.Generator().manual_seed(seed) if seed is not None else None
        return propose_locally(self, token_ids, k, sampling, gen)

    def truncate(self, length: int) -> None:
        self.inner.truncate(length)  # local: the model sees it on the next call

    def close(self) -> None:
        if self._owner.close_async:
            self._owner.pool.submit(_close_quietly, self.inner)
        else:
            self._owner.call(self.inner.close)


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
        return self._owner.call(lambda: inner.verify(token_ids, drafted, sampling, seed))
