"""The acceptance rules on hand-built inputs, and the sampler's output distribution."""

from __future__ import annotations

import math

import pytest
import torch

from trtspec.decoding.acceptance import (
    draw_at,
    greedy_accept,
    greedy_verify,
    match_draws,
    position_seed,
    rejection_sample,
    warp_probs,
)
from trtspec.decoding.types import SamplingParams


def onehot_logits(rows: list[int], vocab: int = 6) -> torch.Tensor:
    out = torch.full((len(rows), vocab), -5.0)
    for i, t in enumerate(rows):
        out[i, t] = 5.0
    return out


@pytest.mark.parametrize(
    ("draft", "target_argmax", "expected"),
    [
        ([1, 2, 3], [1, 2, 3, 4], (3, 4)),  # all accepted, bonus 4
        ([1, 2, 3], [1, 5, 3, 4], (1, 5)),  # rejects at 1, correction 5
        ([1, 2, 3], [0, 2, 3, 4], (0, 0)),  # rejects at 0, correction 0
        ([1, 2, 3], [1, 2, 0, 4], (2, 0)),  # rejects at 2 (a later match does not count)
        ([], [4], (0, 4)),  # k = 0: plain target step
    ],
)
def test_greedy_verify(draft, target_argmax, expected):
    assert greedy_verify(torch.tensor(draft, dtype=torch.int64), onehot_logits(target_argmax)) == expected
    assert greedy_accept(draft, target_argmax) == expected  # from the argmax tokens alone


def test_rejection_sample_hand_built_rows():
    g = torch.Generator().manual_seed(0)
    x = torch.tensor([2, 3])
    # p puts no mass on token 2: x_1 must be rejected, and the correction
    # comes from max(0, p - q), which here is all on token 0.
    p = torch.tensor([[1.0, 0, 0, 0], [0.25] * 4, [0.25] * 4])
    q = torch.tensor([[0.0, 0, 1.0, 0], [0.25] * 4])
    n, tok, bonus = rejection_sample(x, q, p, g)
    assert (n, tok, bonus) == (0, 0, False)  # rejects at 0, resamples token 0
    # p == q: every draft token is accepted and the bonus comes from p_{k+1}.
    p2 = torch.tensor([[0, 0, 1.0, 0], [0, 0, 0, 1.0], [0, 1.0, 0, 0]])
    q2 = p2[:2].clone()
    assert rejection_sample(x, q2, p2, g) == (2, 1, True)  # accepts both, bonus 1


def _sample_positions(p: torch.Tensor, q: torch.Tensor, n: int, seed: int) -> list[torch.Tensor]:
    """Run rejection sampling n times; return per output position the token counts."""
    k, vocab = q.shape
    g = torch.Generator().manual_seed(seed)
    counts = [torch.zeros(vocab) for _ in range(k + 1)]
    for _ in range(n):
        x = torch.stack([torch.multinomial(q[i], 1, generator=g)[0] for i in range(k)])
        n_acc, tok, _ = rejection_sample(x, q, p, g)
        emitted = x[:n_acc].tolist() + [tok]
        for pos, t in enumerate(emitted):
            counts[pos][t] += 1
    return counts


def _within_tolerance(counts: torch.Tensor, expected: torch.Tensor) -> bool:
    """Every token's frequency within 5 standard errors (+0.002) of its probability."""
    total = counts.sum()
    freq = counts / total
    se = torch.sqrt(expected * (1 - expected) / total)
    return bool(((freq - expected).abs() <= 5 * se + 0.002).all())


CASES = {
    "equal": (torch.tensor([0.1, 0.2, 0.3, 0.4, 0.0, 0.0]), torch.tensor([0.1, 0.2, 0.3, 0.4, 0.0, 0.0])),
    "disjoint_supports": (torch.tensor([0.5, 0.3, 0.2, 0.0, 0.0, 0.0]), torch.tensor([0.0, 0.0, 0.0, 0.2, 0.3, 0.5])),
    "overlapping": (torch.tensor([0.05, 0.15, 0.4, 0.1, 0.2, 0.1]), torch.tensor([0.3, 0.3, 0.1, 0.1, 0.1, 0.1])),
    "peaked_draft_flat_target": (torch.full((6,), 1 / 6), torch.tensor([0.9, 0.02, 0.02, 0.02, 0.02, 0.02])),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_rejection_sampling_follows_the_target_distribution(case):
    p_row, q_row = CASES[case]
    k = 2
    # Different rows per position, so position mix-ups would show.
    p = torch.stack([p_row, p_row.roll(1), p_row.roll(2)])  # [k+1, vocab]
    q = torch.stack([q_row, q_row.roll(1)])  # [k, vocab]
    counts = _sample_positions(p, q, n=6000, seed=1234)
    for pos in range(k + 1):
        if counts[pos].sum() < 500:  # too few samples reach this position (draft rarely accepted)
            continue
        assert _within_tolerance(counts[pos], p[pos]), (case, pos, counts[pos] / counts[pos].sum(), p[pos])
    # The test has power: the draft's own distribution is rejected by it (unless p == q).
    if case != "equal":
        assert not _within_tolerance(counts[0], q[0])


def test_rejection_sampling_is_deterministic_under_a_seed():
    p = torch.softmax(torch.randn(4, 50, generator=torch.Generator().manual_seed(3)), -1)
    q = torch.softmax(torch.randn(3, 50, generator=torch.Generator().manual_seed(4)), -1)
    x = torch.tensor([1, 2, 3])

    def run(seed):
        g = torch.Generator().manual_seed(seed)
        return [rejection_sample(x, q, p, g) for _ in range(30)]

    assert run(7) == run(7)
    assert run(7) != run(8)


def test_warp_probs_temperature_top_k_top_p():
    logits = torch.tensor([[4.0, 3.0, 2.0, 1.0, 0.0]])
    # top-k 2: only the two best tokens keep mass.
    pk = warp_probs(logits, SamplingParams(temperature=1.0, top_k=2))
    assert (pk[0, 2:] == 0).all() and math.isclose(float(pk.sum()), 1.0, rel_tol=1e-6)
    # top-p: softmax is [0.64, 0.24, 0.09, 0.03, 0.01]; p=0.8 keeps the first two (0.64 < 0.8).
    pp = warp_probs(logits, SamplingParams(temperature=1.0, top_p=0.8))
    assert (pp[0, :2] > 0).all() and (pp[0, 2:] == 0).all()
    # top-p smaller than the top token's mass keeps just the top token.
    assert warp_probs(logits, SamplingParams(temperature=1.0, top_p=0.1))[0].tolist() == [1.0, 0, 0, 0, 0]
    # low temperature sharpens.
    cold = warp_probs(logits, SamplingParams(temperature=0.1))
    hot = warp_probs(logits, SamplingParams(temperature=2.0))
    assert cold[0, 0] > 0.99 > hot[0, 0]


# -- exact mode: position-keyed draws, token matching ---------------------------


def test_position_seed_depends_only_on_seed_and_position():
    seeds = [position_seed(7, t) for t in range(200)]
    assert seeds == [position_seed(7, t) for t in range(200)]  # the same again
    assert all(0 <= x < 2**63 for x in seeds) and len(set(seeds)) == 200
    assert position_seed(8, 5) != position_seed(7, 5)


def test_draw_at_is_a_fixed_function_of_seed_and_position():
    p = torch.softmax(torch.randn(50, generator=torch.Generator().manual_seed(0)), dim=-1)
    draws = [draw_at(p, 3, t) for t in range(100)]
    assert draws == [draw_at(p, 3, t) for t in range(100)]
    assert len(set(draws)) > 10  # different positions, different draws
    q = torch.tensor([0.5, 0.0, 0.5])
    assert all(draw_at(q, 1, t) != 1 for t in range(200))  # no mass, never drawn


def test_match_draws_accepts_drafts_equal_to_the_targets_own_draws():
    p = torch.softmax(torch.randn(4, 50, generator=torch.Generator().manual_seed(0)), dim=-1)  # [k+1, vocab]
    y = [draw_at(p[i], 3, 10 + i) for i in range(4)]  # the target alone at positions 10..13
    assert match_draws(y[:3], p, seed=3, start=10) == (3, y[3])  # all accepted, bonus y_13
    wrong = (y[1] + 1) % 50
    assert match_draws([y[0], wrong, y[2]], p, seed=3, start=10) == (1, y[1])  # rejects at 1, emits y_11
    assert match_draws([], p[:1], seed=3, start=10) == (0, y[0])  # k = 0: the target's draw


def test_position_keyed_draws_follow_the_target_distribution():
    p = torch.tensor([0.5, 0.25, 0.125, 0.125])
    n = 4000
    counts = torch.zeros(4)
    for t in range(n):
        counts[draw_at(p, 11, t)] += 1
    chi2 = float((((counts - n * p) ** 2) / (n * p)).sum())
    assert chi2 < 16.3  # 3 degrees of freedom, p = 0.001


def test_a_close_distribution_drawn_with_the_same_noise_mostly_agrees():
    gen = torch.Generator().manual_seed(1)
    logits = torch.randn(300, 1000, generator=gen)
    p = torch.softmax(logits, dim=-1)
    q = torch.softmax(logits + 0.05 * torch.randn(300, 1000, generator=gen), dim=-1)  # a near copy
    same = sum(draw_at(p[t], 5, t) == draw_at(q[t], 5, t) for t in range(300))
    other = sum(draw_at(p[t], 5, t) == draw_at(q[t], 6, t) for t in range(300))  # independent noise
    assert same > 0.8 * 300 and other < 0.1 * 300
