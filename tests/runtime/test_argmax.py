"""ArgmaxHead: a float32 model's greedy token through a bfloat16 shortlist, exact whatever the estimates."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from trtspec.runtime.torch import argmax
from trtspec.runtime.torch.argmax import ArgmaxHead
from trtspec.runtime.torch.lean import LeanLlamaLM
from trtspec.runtime.torch.llama import LlamaConfig, LlamaWeights, _linear
from trtspec.runtime.torch.loader import load_model, read_config, read_tensors

VOCAB, HIDDEN = 4096, 96


def _head(seed: int = 0) -> torch.Tensor:
    """Rows of very different sizes (rare tokens' rows are larger), a few outlier columns."""
    g = torch.Generator().manual_seed(seed)
    head = torch.randn(VOCAB, HIDDEN, generator=g) * torch.rand(VOCAB, 1, generator=g).mul(3).add(0.1)
    head[:, :3] *= 8
    return head


def _rows(n: int, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(n, HIDDEN, generator=g)
    h[:, 5] *= 20  # an activation outlier, as real hidden states have
    return h


def _exact(head: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
    """``[R, vocab]``: the logits the head answers the argmax of."""
    return (head[None] * h[:, None]).sum(dim=-1)


def test_every_estimate_lies_within_its_bound() -> None:
    ah = ArgmaxHead(_head())
    h = _rows(64)
    hb = h.to(torch.bfloat16)
    estimate = _linear(hb, ah.approx).float()
    bound = ah.m * ah._radius(h, hb.float())[:, None] + estimate.abs() * 2.0**-8
    err = (estimate - _exact(ah.head, h)).abs()
    assert bool((err <= bound).all()), f"worst error / bound {(err / bound).max().item():.3f}"
    assert (err / bound).max().item() > 1e-3  # the bound is not vacuous: errors reach a share of it


def test_the_answer_is_the_argmax_of_the_exact_logits() -> None:
    ah = ArgmaxHead(_head())
    h = _rows(200)
    assert ah.argmax(h).tolist() == _exact(ah.head, h).argmax(dim=-1).tolist()


def test_near_ties_answer_the_exact_argmax_and_ties_the_lowest_id() -> None:
    """50 tokens whose rows differ in the last bits of one weight (the bfloat16 estimates cannot tell
    them apart), then 50 exact copies of one row."""
    head, h = _head(), _rows(8)
    lead = int(_exact(head, h[:1]).argmax())
    up = torch.tensor(float("inf"))
    for j in range(100, 150):  # near ties: each a float32 step or a few from the leading row
        head[j] = head[lead]
        for _ in range(j % 7):
            head[j, 5] = torch.nextafter(head[j, 5], up)
    near = ArgmaxHead(head)
    assert near.argmax(h).tolist() == _exact(head, h).argmax(dim=-1).tolist()
    tied = head.clone()
    tied[200:250] = tied[lead]  # exact ties with the leading row
    tied[100:150] = 0.0
    want = _exact(tied, h[:1]).argmax(dim=-1)
    assert int(want) == min(lead, 200)
    assert ArgmaxHead(tied).argmax(h[:1]).tolist() == want.tolist()


def test_a_row_answers_the_same_in_any_pass() -> None:
    ah = ArgmaxHead(_head())
    h = _rows(9)
    together = ah.argmax(h).tolist()
    assert [int(ah.argmax(h[r : r + 1])[0]) for r in range(9)] == together
    assert ah.argmax(h[2:7]).tolist() == together[2:7]


def test_only_float32_cpu_models_with_a_tied_head_have_one(tied_target: Path, tiny_target: Path) -> None:
    assert not argmax.applies(torch.bfloat16, "cpu", True)
    assert not argmax.applies(torch.float32, "cuda", True)
    assert not argmax.applies(torch.float32, "cpu", False)
    assert load_model(tiny_target, "fp32", device="cpu").lm.argmax_head is None  # untied
    tied = load_model(tied_target, "fp32", device="cpu").lm
    assert (tied.argmax_head is not None) == argmax.applies(torch.float32, "cpu", True)


@pytest.mark.parametrize("exact", [False, True])
def test_greedy_passes_answer_the_logits_argmax(tied_target: Path, monkeypatch, exact: bool) -> None:
    """A model with an ArgmaxHead (forced on where this CPU would not build one): every greedy pass,
    prefill, decode and verify, answers what its logits' argmax would (the tiny model has no near ties)."""
    monkeypatch.setattr(argmax, "applies", lambda *_: True)
    cfg = LlamaConfig.from_hf(read_config(tied_target))
    weights = LlamaWeights(cfg, read_tensors(tied_target), torch.float32, "cpu")
    from trtspec.runtime.torch.shapes import EXACT_ROWS, ShapePlan

    lm = LeanLlamaLM(weights, plan=ShapePlan(exact_rows=EXACT_ROWS if exact else None))
    assert lm.argmax_head is not None
    greedy, full = lm.new_session("g"), lm.new_session("f")
    seq = [(7 * i + 3) % cfg.vocab_size for i in range(40)]
    for chunk, num_logits in ((seq[:20], 1), (seq[20:21], 1), (seq[21:27], 6), (seq[27:40], 13)):
        assert greedy.forward_argmax(chunk, num_logits) == full.forward(chunk, num_logits).argmax(dim=-1).tolist()
