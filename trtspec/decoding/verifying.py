"""Verifying a proposal with a target :class:`~trtspec.decoding.protocols.LMSession`.

:func:`verify` mirrors :func:`trtspec.decoding.drafting.propose`: one call,
dispatched on what the target session can do, in ONE target pass:

- a :class:`~trtspec.decoding.protocols.DraftVerifier` decides acceptance itself;
- greedy: the target's argmax at the ``k + 1`` positions (from an
  :class:`~trtspec.decoding.protocols.ArgmaxForward` session without logits);
- sampling: the target's logits, then rejection sampling against ``q``, or in
  exact mode token matching against position-keyed draws (``match_draws``).

A request's :class:`~trtspec.decoding.types.LogitRules` (``min_tokens``: no EOS
yet; ``bad_words``; the penalties) act on each row's logits before anything is
chosen: banned tokens at -inf, so the target's choice there is its choice among
the others, drafts or none; penalties over the row's own text, drafts before it
included. A greedy pass with rules reads the logits (not ``forward_argmax``); on a
float32 target with an ``ArgmaxHead`` the two can break a near tie differently
(docs/runtime.md). So does a greedy pass asked for log-probabilities (``logprobs``):
each kept token's log-probability in the row it was chosen from (greedy: the
log-softmax of the row's logits; sampling: the log of its warped probability).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from trtspec.decoding.acceptance import greedy_accept, match_draws, rejection_sample, warp_probs
from trtspec.decoding.protocols import DraftVerifier, LMSession, argmax_ids, has_capability
from trtspec.decoding.types import LogitRules, Proposal, SamplingParams, TopLogprobs
from trtspec.errors import InvalidRequestError


@dataclass(frozen=True)
class Verdict:
    """What the target made of a proposal of ``k`` tokens."""

    accepted: int  # drafted tokens kept, a prefix of the proposal
    next_token: int  # the correction token (accepted < k) or the bonus token
    bonus: bool  # all k drafts accepted (k > 0) and the bonus token drawn
    # The target's token at each drafted position given the drafts before it, for
    # rejection traces: greedy, its argmax at all k positions; otherwise the accepted
    # drafts and then the correction token (what a sampler or an engine tells).
    target_tokens: tuple[int, ...]
    # With logprobs asked: the log-probability of each of the accepted drafts and of next_token, in the
    # row it was chosen from ([accepted + 1]); () otherwise.
    logprobs: tuple[float, ...] = ()
    top_logprobs: tuple[TopLogprobs, ...] = ()  # [accepted + 1] with top_logprobs asked


def verify(
    session: LMSession,
    token_ids: Sequence[int],
    proposal: Proposal,
    sampling: SamplingParams,
    generator: torch.Generator | None,
    rules: LogitRules | None = None,
    logprobs: bool = False,
    top_logprobs: int = 0,
) -> Verdict:
    """Append ``token_ids`` (committed tokens the cache lacks) and the drafts; decide (``rules``: what
    the request does to each row's logits first; ``logprobs``: report the kept tokens' log-probabilities,
    and the ``top_logprobs`` most likely tokens' of their rows).

    Afterwards the cache holds ``token_ids`` and the drafts, or (a
    ``DraftVerifier``) only the accepted ones; the caller truncates.
    """
    drafted = list(proposal.tokens)
    k = len(drafted)
    if has_capability(session, DraftVerifier):  # the target decides; it answers the accepted drafts and one token
        if rules is not None or logprobs:
            raise InvalidRequestError("min_tokens, bad_words, the penalties and log-probabilities need the "
                                      "target's logits; this target decides acceptance in its engine (TensorRT-LLM)")
        seed = None if sampling.greedy else int(torch.randint(0, 2**62, (1,), generator=generator))
        n_acc, nxt = session.verify(token_ids, drafted, sampling, seed)
        return Verdict(n_acc, nxt, k > 0 and n_acc == k, tuple(drafted[:n_acc]) + ((nxt,) if n_acc < k else ()))
    fresh = list(token_ids) + drafted
    if sampling.greedy:
        if rules is None and not logprobs:
            choice = argmax_ids(session, fresh, k + 1)  # [k+1]
            n_acc, nxt = greedy_accept(drafted, choice)
            return Verdict(n_acc, nxt, k > 0 and n_acc == k, tuple(choice[:k]))
        logits = _logits(session, fresh, k, rules, sampling)  # [k+1, vocab]
        choice = logits.argmax(dim=-1).tolist()
        n_acc, nxt = greedy_accept(drafted, choice)
        logp = torch.log_softmax(logits.float(), dim=-1) if logprobs else None  # [k+1, vocab]
        return Verdict(n_acc, nxt, k > 0 and n_acc == k, tuple(choice[:k]),
                       *_kept_logprobs(logp, drafted, n_acc, nxt, top_logprobs))
    start = session.num_cached + len(token_ids)  # sequence position of the first token drawn
    p = warp_probs(_logits(session, fresh, k, rules, sampling), sampling)  # [k+1, vocab]
    if sampling.exact:  # position-keyed draws, token matching: the same output with speculation off
        seed = sampling.seed if sampling.seed is not None else int(torch.randint(0, 2**62, (1,), generator=generator))
        n_acc, nxt = match_draws(drafted, p, seed, start)
        bonus = k > 0 and n_acc == k
    else:
        q = proposal.q if proposal.q is not None else p.new_zeros((0, p.shape[1]))  # [k, vocab]
        x = torch.tensor(drafted, dtype=torch.int64)  # [k]
        n_acc, nxt, bonus = rejection_sample(x, q, p, generator)
    logp = torch.log(p) if logprobs else None
    return Verdict(n_acc, nxt, bonus, tuple(drafted[:n_acc]) + ((nxt,) if n_acc < k else ()),
                   *_kept_logprobs(logp, drafted, n_acc, nxt, top_logprobs))


def _kept_logprobs(logp: torch.Tensor | None, drafted: list[int], n_acc: int, nxt: int,
                   top: int) -> tuple[tuple[float, ...], tuple[TopLogprobs, ...]]:
    """``logp [k+1, vocab]`` (None: not asked) at the kept tokens, the accepted drafts (rows 0..n_acc-1)
    then ``nxt``; and each kept row's ``top`` most likely tokens, those that could be chosen."""
    if logp is None:
        return (), ()
    rows = logp[: n_acc + 1]  # [n_acc + 1, vocab]
    kept = torch.tensor(drafted[:n_acc] + [nxt], dtype=torch.int64)  # [n_acc + 1]
    chosen = tuple(rows[torch.arange(n_acc + 1), kept].tolist())
    if not top:
        return chosen, ()
    values, ids = torch.topk(rows, min(top, rows.shape[-1]), dim=-1)  # [n_acc + 1, top], best first
    best = tuple(tuple((i, v) for i, v in zip(row_ids, row_values) if v != float("-inf"))
                 for row_ids, row_values in zip(ids.tolist(), values.tolist()))
    return chosen, best


def _logits(session: LMSession, fresh: list[int], k: int, rules: LogitRules | None,
            sampling: SamplingParams) -> torch.Tensor:
    """The target's logits at the ``k + 1`` positions, with ``rules`` applied."""
    logits = session.forward(fresh, k + 1)  # [k+1, vocab]
    return logits if rules is None else rules.apply(logits, sampling.temperature)
