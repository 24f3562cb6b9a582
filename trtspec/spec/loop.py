"""The draft-verify loop.

One iteration, with ``L`` committed tokens (prompt + output) and ``k`` chosen
by the policy:

1. draft: feed the draft the committed tokens its cache lacks, then propose
   ``x_1..x_k`` one token at a time (``q_i`` kept when sampling);
2. verify: feed the target the committed tokens its cache lacks plus
   ``x_1..x_k`` in ONE forward pass, giving ``k + 1`` distributions;
3. accept: greedy or rejection sampling keeps ``n`` drafts and yields one more
   token (correction or bonus);
4. commit ``x_1..x_n, y`` through the stop checker, then roll both caches back
   to the ``L + n`` tokens they hold validly (``y`` is fed next iteration).

``k == 0`` is a plain target decoding step through the same code path, so
"target alone" and "speculative" differ only in the policy.

A target session with the :class:`~trtspec.spec.protocols.DraftVerifier`
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
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import torch

from trtspec.errors import ContextOverflowError, IncompatibleModelsError
from trtspec.spec.acceptance import greedy_accept, rejection_sample, warp_probs
from trtspec.spec.drafting import propose
from trtspec.spec.policy import FixedDraftLength
from trtspec.spec.protocols import (
    ArgmaxForward,
    Detokenizer,
    DraftLengthPolicy,
    DraftVerifier,
    LanguageModel,
    LMSession,
)
from trtspec.spec.stopping import StopChecker
from trtspec.spec.types import (
    FinishReason,
    GenerationRequest,
    GenerationResult,
    IterationOutcome,
    SpecStats,
    StreamChunk,
)

Clock = Callable[[], float]


class SpeculativeDecoder:
    """Runs requests on a target model, speculating with a draft model when given one."""

    def __init__(
        self,
        target: LanguageModel,
        draft: LanguageModel | None = None,
        detokenizer: Detokenizer | None = None,
        clock: Clock = time.perf_counter,
    ) -> None:
        if draft is not None and draft.vocab_size != target.vocab_size:
            raise IncompatibleModelsError(
                f"draft vocabulary has {draft.vocab_size} entries, target has {target.vocab_size}"
            )
        self.target = target
        self.draft = draft
        self.detokenizer = detokenizer
        self.clock = clock

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
        self.draft_error: BaseException | None = None
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
        )

    # -- the loop ---------------------------------------------------------

    def _run(self) -> Iterator[StreamChunk]:
        dec, req, clock = self._dec, self.request, self._dec.clock
        sp = req.sampling
        gen = torch.Generator().manual_seed(sp.seed) if sp.seed is not None else None
        tokens = list(req.prompt_ids)
        max_ctx = dec.target.max_context
        target = dec.target.new_session(req.request_id)
        verifier = isinstance(target, DraftVerifier)  # the target accepts drafts itself
        argmax_only = sp.greedy and isinstance(target, ArgmaxForward)
        draft: LMSession | None = None
        started = clock()
        prefill = True  # the first iteration: the target's prefill, no draft
        try:
            if dec.draft is not None:
                max_ctx_draft = dec.draft.max_context
                draft = dec.draft.new_session(req.request_id)
            while True:
                if self._cancelled():
                    self._checker.finish(FinishReason.CANCELLED)  # exit: cancelled by the client
                    break
                room = max_ctx - len(tokens)  # tokens we may still append
                if room <= 0:
                    self._checker.finish(FinishReason.CONTEXT)  # exit: context window full
                    break
                budget = req.stop.max_new_tokens - len(self._checker.token_ids)
                k = self._policy.next_k() if draft is not None and not prefill else 0
                # Never draft what could not be emitted: one token of every
                # iteration is the correction/bonus token.
                k = max(0, min(k, budget - 1, room - 1))
                if draft is not None:
                    k = min(k, max(0, max_ctx_draft - len(tokens)))

                # 1. draft
                t0 = clock()
                drafted: list[int] = []
                q_draft: torch.Tensor | None = None  # [k, vocab] when sampling
                draft_failed = False
                if k > 0 and draft is not None:
                    try:
                        proposal = propose(draft, tokens[draft.num_cached :], k, sp, gen)
                        drafted, q_draft = list(proposal.tokens), proposal.q
                        k = len(drafted)  # a proposer may stop short (an engine at its end id)
                    except Exception as e:  # any draft failure: continue on the target alone
                        self.draft_error = e
                        self.stats.draft_errors += 1
                        _close_quietly(draft)
                        draft = None
                        drafted, q_draft = [], None
                        k = 0
                        draft_failed = True
                t1 = clock()

                # 2. verify: committed tokens the target lacks + drafts, ONE pass
                base = len(tokens)
                fresh = tokens[target.num_cached :] + drafted
                # 3. accept
                if verifier:  # the target decides; it answers the accepted drafts and one token
                    seed = None if sp.greedy else int(torch.randint(0, 2**62, (1,), generator=gen))
                    n_acc, nxt = target.verify(fresh[: len(fresh) - k], drafted, sp, seed)  # type: ignore[union-attr]
                    bonus = k > 0 and n_acc == k
                    target_tokens = tuple(drafted[:n_acc]) + ((nxt,) if n_acc < k else ())
                elif sp.greedy:
                    if argmax_only:  # the target answers its argmax tokens, not k + 1 rows of logits
                        choice = target.forward_argmax(fresh, k + 1)  # type: ignore[union-attr]
                    else:
                        choice = target.forward(fresh, k + 1).argmax(dim=-1).tolist()  # [k+1]
                    n_acc, nxt = greedy_accept(drafted, choice)
                    bonus = k > 0 and n_acc == k
                    target_tokens = tuple(choice[:k])
                else:
                    logits = target.forward(fresh, k + 1)  # [k+1, vocab]
                    x = torch.tensor(drafted, dtype=torch.int64)  # [k]
                    p = warp_probs(logits, sp)  # [k+1, vocab]
                    q = q_draft if q_draft is not None else p.new_zeros((0, p.shape[1]))
                    n_acc, nxt, bonus = rejection_sample(x, q, p, gen)
                    target_tokens = tuple(drafted[:n_acc]) + ((nxt,) if n_acc < k else ())
                t2 = clock()

                # 4. commit through the stop checker, then roll caches back
                new = drafted[:n_acc] + [nxt]
                emitted: list[int] = []
                for tok in new:
                    emitted.append(tok)
                    if self._checker.offer(tok):
                        break  # nothing past a stop is emitted
                tokens.extend(emitted)
                target.truncate(base + n_acc)
                if draft is not None and draft.num_cached > base + n_acc:
                    draft.truncate(base + n_acc)

                outcome = IterationOutcome(
                    k=k,
                    accepted=n_acc,
                    emitted=len(emitted),
                    bonus=bonus,
                    context_len=base,
                    draft_time_s=t1 - t0,
                    verify_time_s=t2 - t1,
                    drafted=tuple(drafted),
                    target_tokens=target_tokens,
                    draft_failed=draft_failed,
                )
                self.stats.observe(outcome)
                self._policy.observe(outcome)  # a k == 0 outcome for the prefill: controllers skip it
                prefill = False
                if self.stats.time_to_first_token_s is None:
                    self.stats.time_to_first_token_s = clock() - started
                self.stats.total_time_s = clock() - started
                yield StreamChunk(tuple(emitted), self._checker.take_new_text())
                if self._checker.done:
                    break  # exit: EOS / stop token / stop string / max new tokens
            tail = self._checker.take_new_text()
            if tail:
                yield StreamChunk((), tail)
        finally:
            self.stats.total_time_s = clock() - started
            _close_quietly(target)
            if draft is not None:
                _close_quietly(draft)


def _close_quietly(session: LMSession) -> None:
    try:
        session.close()
    except Exception:  # closing must never mask the loop's own outcome
        pass
