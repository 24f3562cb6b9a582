"""Drafting ``k`` tokens with a draft :class:`~trtspec.spec.protocols.LMSession`."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from trtspec.spec.acceptance import sample, warp_probs
from trtspec.spec.protocols import DraftProposer, LMSession
from trtspec.spec.types import Proposal, SamplingParams


def propose_locally(
    session: LMSession,
    token_ids: Sequence[int],
    k: int,
    sampling: SamplingParams,
    generator: torch.Generator | None,
) -> Proposal:
    """Append ``token_ids`` to ``session``, then draft ``x_1..x_k`` one forward at a time.

    Greedy: ``x_i`` is the draft's argmax. Sampling: ``x_i ~ q_i``, the draft's
    logits warped like the target's (temperature, top-k, top-p). ``x_k`` is not
    fed: the session ends holding ``token_ids`` plus ``x_1..x_{k-1}``.
    """
    assert k >= 1 and len(token_ids) >= 1
    logits = session.forward(token_ids, 1)  # [1, vocab]
    tokens: list[int] = []
    q_rows: list[torch.Tensor] = []
    for i in range(k):
        if sampling.greedy:
            tok = int(logits[0].argmax())
        else:
            q = warp_probs(logits, sampling)[0]  # [vocab]
            tok = sample(q, generator)
            q_rows.append(q)
        tokens.append(tok)
        if i < k - 1:
            logits = session.forward([tok], 1)
    return Proposal(tokens=tuple(tokens), q=torch.stack(q_rows) if q_rows else None)


def propose(
    session: LMSession,
    token_ids: Sequence[int],
    k: int,
    sampling: SamplingParams,
    generator: torch.Generator | None,
) -> Proposal:
    """Draft with the session's own one-call :class:`DraftProposer` when it has one."""
    if isinstance(session, DraftProposer):
        seed = None
        if not sampling.greedy:  # the remote side samples from a generator seeded from ours
            seed = int(torch.randint(0, 2**62, (1,), generator=generator))
        return session.propose(token_ids, k, sampling, seed)
    return propose_locally(session, token_ids, k, sampling, generator)
