"""Drafting ``k`` tokens: with a draft :class:`~trtspec.decoding.protocols.LMSession`
(:func:`propose`), and the draft model as a :class:`~trtspec.decoding.protocols.Drafter`."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from trtspec.decoding.acceptance import draw_at, sample, warp_probs
from trtspec.decoding.protocols import DraftProposer, LanguageModel, LMSession, argmax_ids, has_capability
from trtspec.decoding.types import LogitRules, Proposal, SamplingParams


def deterministic_proposal(tokens: Sequence[int], sampling: SamplingParams, vocab_size: int) -> Proposal:
    """A proposal of tokens picked without sampling (a lookup, not a model).

    Sampling needs the distributions the drafts were drawn from: here each row
    puts probability 1 on its token, so rejection sampling accepts ``x_i`` with
    probability ``p_i(x_i)`` and otherwise draws from ``p_i`` without ``x_i``:
    still exactly the target's distribution.
    """
    drafted = tuple(int(t) for t in tokens)
    if sampling.greedy or not drafted:
        return Proposal(tokens=drafted, q=None)
    q = torch.zeros((len(drafted), vocab_size))  # [k, vocab]
    q[torch.arange(len(drafted)), torch.tensor(drafted, dtype=torch.int64)] = 1.0
    return Proposal(tokens=drafted, q=q)


def propose_locally(
    session: LMSession,
    token_ids: Sequence[int],
    k: int,
    sampling: SamplingParams,
    generator: torch.Generator | None,
    text: Sequence[int] = (),
) -> Proposal:
    """Append ``token_ids`` to ``session``, then draft ``x_1..x_k`` one forward at a time.

    Greedy: ``x_i`` is the draft's argmax (``forward_argmax`` where the session answers it:
    only ids travel, and a float32 lean model's ``ArgmaxHead`` skips most of its LM head).
    Sampling: ``x_i ~ q_i``, the draft's logits warped like the target's
    (temperature, top-k, top-p); in exact mode with a seed, drawn with the noise
    the target's draw at that position uses
    (:func:`~trtspec.decoding.acceptance.draw_at`), so the two mostly agree
    when ``q_i`` is close to ``p_i``. The request's logit bias and penalties act on
    the draft's logits as on the target's, the penalties over ``text`` (the whole
    sequence ``token_ids`` ends) and the drafts before: each draft is then the
    draft's guess at the biased, penalised target's choice. ``x_k`` is not fed: the session ends holding ``token_ids`` plus
    ``x_1..x_{k-1}``.
    """
    assert k >= 1 and len(token_ids) >= 1
    plain = sampling.penalties.neutral and sampling.logit_bias.neutral
    if sampling.greedy and plain:  # ids only (an ArgmaxHead answers them faster)
        ids = argmax_ids(session, token_ids, 1)
        while len(ids) < k:
            ids += argmax_ids(session, ids[-1:], 1)
        return Proposal(tokens=tuple(ids), q=None)
    logits = session.forward(token_ids, 1)  # [1, vocab]
    tokens: list[int] = []
    q_rows: list[torch.Tensor] = []
    for i in range(k):
        if not plain:
            rules = LogitRules(penalties=sampling.penalties, context=tuple(text) + tuple(tokens),
                               bias=sampling.logit_bias)
            logits = rules.apply(logits, sampling.temperature)
        tok, q = _draw(logits, sampling, generator, session.num_cached)
        tokens.append(tok)
        q_rows += [] if q is None else [q]
        if i < k - 1:
            logits = session.forward([tokens[-1]], 1)
    return Proposal(tokens=tuple(tokens), q=torch.stack(q_rows) if q_rows else None)


def _draw(logits: torch.Tensor, sampling: SamplingParams, generator: torch.Generator | None,
          position: int) -> tuple[int, torch.Tensor | None]:
    """The draft token from ``logits`` [1, vocab] and the distribution ``q`` [vocab] it was drawn
    from: greedy, the argmax (no ``q``); else a draw from the warped logits."""
    if sampling.greedy:
        return int(logits[0].argmax()), None
    q = warp_probs(logits, sampling)[0]  # [vocab]
    if sampling.exact and sampling.seed is not None:  # the target's position-keyed draw, from q
        return draw_at(q, sampling.seed, position), q
    return sample(q, generator), q


def propose(
    session: LMSession,
    token_ids: Sequence[int],
    k: int,
    sampling: SamplingParams,
    generator: torch.Generator | None,
    text: Sequence[int] = (),
) -> Proposal:
    """Draft with the session's own one-call :class:`DraftProposer` when it has one (it holds the
    whole sequence; ``text`` is that sequence, for drafting here)."""
    if has_capability(session, DraftProposer):
        seed = None
        if not sampling.greedy:  # the remote side samples from a generator seeded from ours
            seed = int(torch.randint(0, 2**62, (1,), generator=generator))
        return session.propose(token_ids, k, sampling, seed, text)
    return propose_locally(session, token_ids, k, sampling, generator, text)


class ModelDrafter:
    """The draft model as a :class:`~trtspec.decoding.protocols.Drafter`: one session per request.

    Each proposal first feeds the committed tokens the draft's cache lacks (the
    correction or bonus token of the last iteration, or the whole prompt at
    first), then drafts; it drafts no further than the draft's context window.
    """

    name = "model"

    def __init__(self, model: LanguageModel, session_id: str = "") -> None:
        self._model = model
        self._session_id = session_id
        self._max_context = model.max_context
        self._session = model.new_session(session_id)

    def propose(
        self, tokens: Sequence[int], k: int, sampling: SamplingParams, generator: torch.Generator | None
    ) -> Proposal:
        k = min(k, self._max_context - len(tokens))
        if k <= 0:
            return Proposal(tokens=(), q=None)
        return propose(self._session, tokens[self._session.num_cached :], k, sampling, generator, tokens)

    def rollback(self, length: int) -> None:
        if self._session.num_cached > length:
            self._session.truncate(length)

    def restart(self) -> None:
        """Close the session and open a fresh one (its first proposal reads the whole sequence):
        after a late call, which may still be writing to the old one."""
        self._session.close()
        self._session = self._model.new_session(self._session_id)

    def close(self) -> None:
        self._session.close()
