"""The draft-verify loop.

One iteration, with ``L`` committed tokens (prompt + output) and ``k`` chosen
by the policy:

1. draft: the :class:`~trtspec.decoding.protocols.Drafter` proposes up to ``k``
   tokens ``x_1..x_k`` (a draft model feeds the committed tokens its cache
   lacks, then drafts one token at a time; ``q_i`` kept when sampling);
2. verify: feed the target the committed tokens its cache lacks plus
   ``x_1..x_k`` in ONE forward pass, giving ``k + 1`` distributions;
3. accept: greedy or rejection sampling keeps ``n`` drafts and yields one more
   token (correction or bonus); steps 2-3 are
   :func:`~trtspec.decoding.verifying.verify`, and 1-3 are ``_iterate``;
4. commit ``x_1..x_n, y`` through the stop checker, then roll the target and
   the drafter back to the ``L + n`` tokens they hold validly (``y`` is fed
   next iteration).

``k == 0`` is a plain target decoding step through the same code path, so
"target alone" and "speculative" differ only in the policy.

A target session with the :class:`~trtspec.decoding.protocols.DraftVerifier`
capability does steps 2-3 itself (a TensorRT-LLM engine built for external
draft tokens): it gets the tokens and the drafts and answers how many it kept
and the token after them; the loop then only commits. Rejection traces of such a
target hold its choices up to the first rejection (the engine sends no more).

The first iteration is always ``k == 0``: the target's prefill gives the first
token at once, so speculation never delays the first token (through Triton on
the demo pair, drafting in the first iteration took time to first token from
240 ms to 800 ms); the draft catches up on the prompt in the second iteration.
The policy does not choose that iteration's ``k`` but observes it (``k == 0``,
like any target-only iteration: metrics count its token, controllers skip it).

A drafter that fails leaves the request, which goes on with the target alone
(or its other drafters); no token is lost or repeated, and the policy sees the
iteration's ``draft_failed``. A draft model that was late (a served model's
deadline, :class:`~trtspec.errors.ModelTimeoutError`) is busy, not broken: it
restarts in a fresh session (the late call may still be writing to the old
one), which reads the whole sequence at its next proposal, whenever the policy
chooses it again (``RequestControl`` rests it for the fallback's cool-down
first). Its ``MAX_LATE_DRAFTS``-th late call in one request drops it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch

from trtspec.errors import ContextOverflowError, IncompatibleModelsError, ModelTimeoutError
from trtspec.decoding.drafters import DrafterOptions, open_drafters
from trtspec.decoding.drafting import ModelDrafter
from trtspec.decoding.policy import FixedDraftLength
from trtspec.decoding.protocols import (
    Detokenizer,
    Drafter,
    DraftLengthPolicy,
    LanguageModel,
    LMSession,
    choose_drafter,
)
from trtspec.decoding.stopping import StopChecker
from trtspec.decoding.types import (
    FinishReason,
    GenerationRequest,
    GenerationResult,
    IterationOutcome,
    Proposal,
    SpecStats,
    StreamChunk,
    TopLogprobs,
)
from trtspec.decoding.verifying import Verdict, verify

Clock = Callable[[], float]
MAX_LATE_DRAFTS = 3  # late draft model calls one request takes: each restarts the drafter, the last drops it


class SpeculativeDecoder:
    """Runs requests on a target model, speculating with the drafters each request asks for
    (``request.drafter``: the draft model when given one, or a free drafter)."""

    def __init__(
        self,
        target: LanguageModel,
        draft: LanguageModel | None = None,
        detokenizer: Detokenizer | None = None,
        clock: Clock = time.perf_counter,
        drafter_options: DrafterOptions | None = None,
    ) -> None:
        if draft is not None and draft.vocab_size != target.vocab_size:
            raise IncompatibleModelsError(
                f"draft vocabulary has {draft.vocab_size} entries, target has {target.vocab_size}"
            )
        self.target = target
        self.draft = draft
        self.detokenizer = detokenizer
        self.clock = clock
        self.drafter_options = drafter_options or DrafterOptions()
        self.suffix_store = self.drafter_options.make_store()  # recent outputs, shared by all requests

    def stream(
        self,
        request: GenerationRequest,
        policy: DraftLengthPolicy | None = None,
        cancelled: Callable[[], bool] | None = None,
    ) -> Generation:
        """Start ``request``; iterate the returned object for :class:`StreamChunk`s."""
        request.validate(self.target.vocab_size)
        if len(request.prompt_ids) >= self.target.max_context:
            raise ContextOverflowError(
                f"prompt has {len(request.prompt_ids)} tokens; the context window holds "
                f"{self.target.max_context}, leaving no room to generate"
            )
        return Generation(self, request, policy or FixedDraftLength(0), cancelled or (lambda: False))

    def generate(
        self,
        request: GenerationRequest,
        policy: DraftLengthPolicy | None = None,
        cancelled: Callable[[], bool] | None = None,
    ) -> GenerationResult:
        """Run ``request`` to the end and return the whole result."""
        gen = self.stream(request, policy, cancelled)
        for _ in gen:
            pass
        return gen.result


class Generation(Iterator[StreamChunk]):
    """A running request: iterate for chunks; ``result`` once exhausted."""

    def __init__(
        self,
        decoder: SpeculativeDecoder,
        request: GenerationRequest,
        policy: DraftLengthPolicy,
        cancelled: Callable[[], bool],
    ) -> None:
        self._dec = decoder
        self.request = request
        self._policy = policy
        self._cancelled = cancelled
        self.stats = SpecStats(prompt_tokens=len(request.prompt_ids))
        self.draft_error: BaseException | None = None  # the last draft failure
        self._late_drafts = 0
        self._logprobs: list[float] | None = [] if request.logprobs else None  # of the emitted tokens
        self._top: list[TopLogprobs] | None = [] if request.top_logprobs else None  # at each emitted token
        seed = request.sampling.seed
        self._generator = torch.Generator().manual_seed(seed) if seed is not None else None
        self._checker = StopChecker(request.stop, decoder.detokenizer)
        self._it = self._run()

    def __next__(self) -> StreamChunk:
        return next(self._it)

    def close(self) -> None:
        """Stop early (frees both KV caches)."""
        self._it.close()
        self._checker.finish(FinishReason.CANCELLED)

    @property
    def finished(self) -> bool:
        return self._checker.done

    @property
    def result(self) -> GenerationResult:
        if not self._checker.done:
            raise RuntimeError("generation has not finished; iterate it first")
        assert self._checker.finish_reason is not None
        return GenerationResult(
            token_ids=list(self._checker.token_ids),
            text=self._checker.text(),
            finish_reason=self._checker.finish_reason,
            stats=self.stats,
            logprobs=None if self._logprobs is None else list(self._logprobs),
            top_logprobs=None if self._top is None else list(self._top),
        )

    # -- the loop ---------------------------------------------------------

    def _run(self) -> Iterator[StreamChunk]:
        dec, req, clock = self._dec, self.request, self._dec.clock
        tokens = list(req.prompt_ids)  # committed: prompt and output so far
        target = dec.target.new_session(req.request_id)
        drafters: list[Drafter] = []
        started = clock()
        try:
            drafters = open_drafters(req, dec.target.vocab_size, dec.draft, dec.drafter_options, dec.suffix_store)
            prefill = True  # the first iteration: the target's prefill, no draft
            while True:
                if self._cancelled():
                    self._checker.finish(FinishReason.CANCELLED)  # exit: cancelled by the client
                    break
                room = dec.target.max_context - len(tokens)  # tokens we may still append
                if room <= 0:
                    self._checker.finish(FinishReason.CONTEXT)  # exit: context window full
                    break
                budget = req.stop.max_new_tokens - len(self._checker.token_ids)
                drafter = self._choose(drafters) if not prefill else None
                k = self._policy.next_k() if drafter is not None else 0
                # Never draft what could not be emitted: one token of every
                # iteration is the correction/bonus token.
                k = max(0, min(k, budget - 1, room - 1))
                step = self._iterate(tokens, target, drafter, k)
                if step.draft_failed and drafter is not None:
                    self._after_draft_failure(drafters, drafter)
                emitted = self._commit(tokens, target, drafters, step)
                outcome = step.outcome(len(emitted), context_len=len(tokens) - len(emitted))
                self.stats.observe(outcome)
                self._policy.observe(outcome)  # a k == 0 outcome for the prefill: controllers skip it
                prefill = False
                if self.stats.time_to_first_token_s is None:
                    self.stats.time_to_first_token_s = clock() - started
                self.stats.total_time_s = clock() - started
                logprobs, top = step.verdict.logprobs[: len(emitted)], step.verdict.top_logprobs[: len(emitted)]
                if self._logprobs is not None:
                    self._logprobs.extend(logprobs)
                if self._top is not None:
                    self._top.extend(top)
                yield StreamChunk(tuple(emitted), self._checker.take_new_text(), logprobs, top)
                if self._checker.done:
                    break  # exit: EOS / stop token / stop string / max new tokens
            tail = self._checker.take_new_text()
            if tail:
                yield StreamChunk((), tail)
        finally:
            self.stats.total_time_s = clock() - started
            _close_quietly(target)
            for d in drafters:
                _close_quietly(d)

    def _after_draft_failure(self, drafters: list[Drafter], drafter: Drafter) -> None:
        """A late draft model restarts (the module docstring); any other failure, or its
        ``MAX_LATE_DRAFTS``-th late call, drops the drafter for the rest of the request."""
        if isinstance(self.draft_error, ModelTimeoutError) and isinstance(drafter, ModelDrafter):
            self._late_drafts += 1
            if self._late_drafts < MAX_LATE_DRAFTS:
                try:
                    drafter.restart()
                    return
                except Exception:  # no fresh session to be had (a server shutting down): go on without it
                    pass
        drafters.remove(drafter)
        _close_quietly(drafter)

    def _choose(self, drafters: list[Drafter]) -> Drafter | None:
        """The drafter of this iteration: the policy's choice when it makes one, else the first."""
        if not drafters:
            return None
        name = choose_drafter(self._policy, [d.name for d in drafters])
        return next((d for d in drafters if d.name == name), drafters[0])

    def _iterate(self, tokens: list[int], target: LMSession, drafter: Drafter | None, k: int) -> _Step:
        """One iteration: draft up to ``k`` tokens, verify them in one target pass."""
        sp, clock = self.request.sampling, self._dec.clock
        t0 = clock()
        proposal = Proposal(tokens=(), q=None)
        draft_failed = False
        if k > 0 and drafter is not None:
            try:
                proposal = drafter.propose(tokens, k, sp, self._generator)
            except Exception as e:  # any draft failure: this and later iterations run on the target alone
                self.draft_error = e
                self.stats.draft_errors += 1
                draft_failed = True
        t1 = clock()
        # A drafter may propose fewer than k tokens (an engine at its end id): k is what it sent.
        rules = self.request.rules(tokens, len(self._checker.token_ids), proposal.tokens)
        verdict = verify(target, tokens[target.num_cached :], proposal, sp, self._generator, rules,
                         self.request.logprobs, self.request.top_logprobs)
        name = drafter.name if drafter is not None and k > 0 else ""
        return _Step(proposal.tokens, verdict, t1 - t0, clock() - t1, draft_failed, name)

    def _commit(self, tokens: list[int], target: LMSession, drafters: list[Drafter], step: _Step) -> list[int]:
        """Offer the accepted drafts and the next token to the stop checker, append what it
        took to ``tokens``, and roll both caches back to what they hold validly (the next
        token is fed next iteration). Returns the emitted tokens."""
        base, n_acc = len(tokens), step.verdict.accepted
        emitted: list[int] = []
        for tok in step.drafted[:n_acc] + (step.verdict.next_token,):
            emitted.append(tok)
            if self._checker.offer(tok):
                break  # nothing past a stop is emitted
        tokens.extend(emitted)
        target.truncate(base + n_acc)
        for drafter in drafters:
            drafter.rollback(base + n_acc)
        return emitted


@dataclass(frozen=True)
class _Step:
    """What one iteration did, before the stop checker saw its tokens."""

    drafted: tuple[int, ...]  # [k]
    verdict: Verdict
    draft_time_s: float
    verify_time_s: float
    draft_failed: bool
    drafter: str  # "" when none drafted

    def outcome(self, emitted: int, context_len: int) -> IterationOutcome:
        return IterationOutcome(
            k=len(self.drafted),
            accepted=self.verdict.accepted,
            emitted=emitted,
            bonus=self.verdict.bonus,
            context_len=context_len,
            draft_time_s=self.draft_time_s,
            verify_time_s=self.verify_time_s,
            drafted=self.drafted,
            target_tokens=self.verdict.target_tokens,
            draft_failed=self.draft_failed,
            drafter=self.drafter,
        )


def _close_quietly(session: LMSession | Drafter) -> None:
    try:
        session.close()
    except Exception:  # closing must never mask the loop's own outcome
        pass
