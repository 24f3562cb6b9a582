"""Acceptance rules: which drafted tokens the target keeps, and the token after them.

Pure functions over tensors; no model, no state. Shapes are checked with
``assert`` at the top (a violated shape is a bug in the caller, not bad input).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from trtspec.decoding.types import SamplingParams


def warp_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Turn logits ``[n, vocab]`` into sampling probabilities ``[n, vocab]`` (float32).

    Applies temperature, then top-k, then top-p (nucleus), the order HF
    transformers and TensorRT-LLM use. The same warp must be applied to the
    draft's and the target's logits for rejection sampling to be exact with
    respect to the *warped* target distribution.
    """
    assert logits.dim() == 2, f"logits must be [n, vocab], got {tuple(logits.shape)}"
    assert not params.greedy, "warp_probs is for sampling; greedy uses argmax"
    x = logits.float() / params.temperature
    vocab = x.shape[-1]
    if 0 < params.top_k < vocab:
        kth = torch.topk(x, params.top_k, dim=-1).values[:, -1:]  # [n, 1]
        x = x.masked_fill(x < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_x, order = torch.sort(x, dim=-1, descending=True)
        sorted_p = torch.softmax(sorted_x, dim=-1)
        mass_before = torch.cumsum(sorted_p, dim=-1) - sorted_p  # [n, vocab]
        drop_sorted = mass_before >= params.top_p  # the top token is never dropped
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        x = x.masked_fill(drop, float("-inf"))
    return torch.softmax(x, dim=-1)


def sample(probs: torch.Tensor, generator: torch.Generator | None) -> int:
    """Draw one token id from ``probs [vocab]``."""
    assert probs.dim() == 1
    return int(torch.multinomial(probs, 1, generator=generator))


def greedy_verify(draft_tokens: torch.Tensor, target_logits: torch.Tensor) -> tuple[int, int]:
    """Greedy acceptance: keep the longest draft prefix equal to the target's argmax.

    ``draft_tokens``: ``[k]`` int64; ``target_logits``: ``[k + 1, vocab]`` where
    row ``i`` is the target's prediction after draft token ``i`` (row 0: after
    the last committed token). Returns ``(n_accepted, next_token)``, where
    ``next_token`` is the target's argmax at position ``n_accepted``: the
    correction token if ``n_accepted < k``, else the bonus token. The emitted
    sequence is therefore exactly what greedy decoding with the target alone
    would produce.
    """
    k = draft_tokens.shape[0]
    assert draft_tokens.dim() == 1
    assert target_logits.dim() == 2 and target_logits.shape[0] == k + 1, (
        f"target_logits must be [k+1, vocab] with k={k}, got {tuple(target_logits.shape)}"
    )
    return greedy_accept(draft_tokens.tolist(), target_logits.argmax(dim=-1).tolist())


def greedy_accept(draft_tokens: Sequence[int], target_choice: Sequence[int]) -> tuple[int, int]:
    """:func:`greedy_verify` from the target's argmax tokens ``[k + 1]`` instead of its logits
    (what a remote target sends back when only greedy acceptance needs its answer)."""
    k = len(draft_tokens)
    assert len(target_choice) == k + 1, f"target_choice must hold k+1 = {k + 1} tokens, got {len(target_choice)}"
    n_accepted = 0
    while n_accepted < k and int(draft_tokens[n_accepted]) == int(target_choice[n_accepted]):
        n_accepted += 1
    return n_accepted, int(target_choice[n_accepted])


def rejection_sample(
    draft_tokens: torch.Tensor,
    q: torch.Tensor,
    p: torch.Tensor,
    generator: torch.Generator | None,
) -> tuple[int, int, bool]:
    """Modified rejection sampling (Leviathan et al. 2023, "Fast Inference from
    Transformers via Speculative Decoding", Alg. 1; Chen et al. 2023,
    "Accelerating LLM Decoding with Speculative Sampling", Alg. 2).

    ``draft_tokens`` ``x_1..x_k``: ``[k]``, with ``x_i ~ q_i``;
    ``q``: ``[k, vocab]`` the draft's (warped) distributions;
    ``p``: ``[k + 1, vocab]`` the target's (warped) distributions, ``p_i`` at
    the position of ``x_i`` and ``p_{k+1}`` after ``x_k``.

    For i = 1..k: draw ``r ~ U(0, 1)`` and accept ``x_i`` if
    ``r < min(1, p_i(x_i) / q_i(x_i))``. At the first rejection, draw the
    correction token from ``norm(max(0, p_i - q_i))``. If all k are accepted,
    draw the bonus token from ``p_{k+1}``. Every emitted token is then
    distributed exactly as the target alone would draw it.

    Returns ``(n_accepted, next_token, bonus)``.
    """
    k = draft_tokens.shape[0]
    assert draft_tokens.dim() == 1
    assert q.dim() == 2 and q.shape[0] == k, f"q must be [k, vocab] with k={k}, got {tuple(q.shape)}"
    assert p.dim() == 2 and p.shape[0] == k + 1, f"p must be [k+1, vocab] with k={k}, got {tuple(p.shape)}"
    assert k == 0 or p.shape[1] == q.shape[1], "draft and target vocabularies differ"
    if k:
        rows = torch.arange(k)
        p_x = p[rows, draft_tokens]  # [k] p_i(x_i)
        q_x = q[rows, draft_tokens]  # [k] q_i(x_i)
        r = torch.rand(k, generator=generator)  # [k]
        accepted = r * q_x < p_x  # r < p/q without dividing by q
        n_accepted = int(accepted.to(torch.int64).cumprod(dim=0).sum())
    else:
        n_accepted = 0
    if n_accepted < k:
        residual = torch.clamp(p[n_accepted] - q[n_accepted], min=0.0)  # max(0, p_i - q_i)
        mass = float(residual.sum())
        # mass == 0 only when p_i <= q_i everywhere, i.e. p_i == q_i, and then
        # the acceptance test above cannot reject; fall back to p_i for safety.
        dist = residual / mass if mass > 0 else p[n_accepted]
        return n_accepted, sample(dist, generator), False
    return n_accepted, sample(p[k], generator), k > 0


_MASK64 = (1 << 64) - 1


def position_seed(seed: int, position: int) -> int:
    """A 63-bit seed that depends only on ``(seed, position)``: SplitMix64 (Steele et al. 2014) of the pair,
    so the same sequence position gets the same randomness however many tokens its pass carried."""
    z = (seed * 0x9E3779B97F4A7C15 + position + 1) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return (z ^ (z >> 31)) >> 1


def draw_at(probs: torch.Tensor, seed: int, position: int) -> int:
    """One draw from ``probs [vocab]`` by the Gumbel-max trick, ``argmax_i(log p_i + G_i)``, with the
    Gumbel noise ``G [vocab]`` a fixed function of ``(seed, position)``.

    Exact in distribution for any ``p``; and a draft that draws with the same
    noise from its own ``q`` picks the same token whenever the perturbed
    argmax agrees, which it does for most positions when ``q`` is close to
    ``p`` (the noise is per token, so small differences between ``q`` and ``p``
    move the argmax only near ties).
    """
    assert probs.dim() == 1
    gen = torch.Generator().manual_seed(position_seed(seed, position))
    u = torch.rand(probs.shape[0], generator=gen, dtype=torch.float64).clamp_(min=1e-300)  # [vocab]
    gumbel = -torch.log(-torch.log(u))
    return int(torch.argmax(torch.log(probs.detach().double().cpu()) + gumbel))


def match_draws(drafted: Sequence[int], p: torch.Tensor, seed: int, start: int) -> tuple[int, int]:
    """Exact-mode sampling: token matching against position-keyed draws.

    The target's token at sequence position ``t`` is ``y_t = draw_at(p_t,
    seed, t)``: a draw from ``p_t`` whose randomness depends only on the seed
    and ``t``. Draft ``x_i`` (at position ``start + i - 1``)
    is accepted iff it equals ``y`` there; the first mismatch emits ``y`` (the
    correction), and after ``k`` matches ``y`` at ``start + k`` is the bonus.
    Every emitted token is then ``y_t``, exactly what the target alone emits
    with the same seed (token matching is exact in distribution: Leviathan et
    al. 2023 discuss it as the degenerate case of rejection sampling with a
    deterministic draft), so with exact-mode logits the output is the same with
    speculation on or off. ``p``: ``[k + 1, vocab]`` warped target probabilities,
    row ``i`` at position ``start + i``. Returns ``(n_accepted, next_token)``.
    """
    k = len(drafted)
    assert p.dim() == 2 and p.shape[0] == k + 1, f"p must be [k+1, vocab] with k={k}, got {tuple(p.shape)}"
    for i in range(k + 1):
        y = draw_at(p[i], seed, start + i)
        if i == k or int(drafted[i]) != y:
            return i, y
    raise AssertionError("unreachable")
