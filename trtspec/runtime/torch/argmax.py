"""A float32 model's greedy token without its whole float32 LM head (the CPU, bfloat16 in hardware).

On a CPU the LM head of a small model is a large share of a decode step: the
demo target's (49,152 x 576 float32, 113 MB) takes about 4 ms of a ~30 ms step,
and more in a verify pass of several rows. Greedy decoding only needs each
row's argmax. :class:`ArgmaxHead` keeps a bfloat16 copy of the head (packed for
oneDNN, half its bytes) and answers a row in two steps:

1. estimate every logit through the bfloat16 copy (one matmul), each with a
   proven bound on its error;
2. only tokens whose estimate plus bound reaches the best estimate minus its
   bound can hold the largest logit: compute those exactly, in float32, from
   the head's own rows, and answer the largest (the lowest id on a tie).

The answer is the argmax of the exact logits ``(head[j] * h).sum()`` whatever
the estimates: a row's answer does not depend on the other rows of its pass
nor on which tokens made the shortlist (a token's exact logit is the same in
any shortlist). Those exact logits equal the float32 matmul's to its last bits,
not bit for bit; greedy decoding with speculation on and off both take this
argmax, so they agree with each other.

The bound, for token ``j`` with ``m_j = max_i |head_ji| (1 + 2^-8)`` and a row
``h`` of ``d`` values (``hb``: ``h`` in bfloat16; ``g = 2 (d + 16) 2^-24``,
twice the rounding of a float32 sum of ``d`` terms)::

    |estimate_j - exact_j| <= m_j (|hb - h|_1 + 2^-9 |h|_1 + g (|hb|_1 + |h|_1)) + 2^-8 |estimate_j|

``|hb - h|_1``: the activations in bfloat16; ``2^-9 |h|_1``: the head in
bfloat16 (``|bf16(w) - w| <= 2^-9 |w|``); the ``g`` terms: the float32 sums of
the matmul (oneDNN accumulates bfloat16 products in float32) and of the exact
logit; ``2^-8``: the matmul's bfloat16 output.
"""

from __future__ import annotations

import torch

from trtspec.runtime.torch.llama import _linear, _nbytes, _rms_norm, pack_cpu, packs

_OUTPUT_ROUNDING = 2.0**-8  # relative: the bfloat16 output of the estimate, with room


def applies(dtype: torch.dtype, device_type: str, tied: bool) -> bool:
    """Whether a model answers greedy passes through an :class:`ArgmaxHead`: float32 on a CPU where
    bfloat16 matrices pack (:func:`~trtspec.runtime.torch.llama.packs`), with its LM head tied to
    the embedding (whose plain float32 rows the exact step reads)."""
    return device_type == "cpu" and dtype == torch.float32 and tied and packs(torch.bfloat16, "cpu")


def extra_bytes(vocab: int, hidden: int) -> int:
    """Bytes an :class:`ArgmaxHead` holds beyond the head itself: the bfloat16 copy and ``m``."""
    return vocab * hidden * 2 + vocab * 4


class ArgmaxHead:
    """The argmax of ``h @ head.T`` per row, through a bfloat16 shortlist (see the module docstring)."""

    def __init__(self, head: torch.Tensor) -> None:
        assert head.dim() == 2 and head.dtype == torch.float32 and head.device.type == "cpu", (head.shape, head.dtype)
        self.head = head  # [vocab, hidden] float32, plain (the embedding's own tensor)
        approx = head.to(torch.bfloat16)
        self.approx = pack_cpu(approx) if packs(torch.bfloat16, "cpu") else approx  # [vocab, hidden] bfloat16
        self.m = head.abs().amax(dim=1) * (1.0 + 2.0**-8)  # [vocab]
        self.m_max = float(self.m.max())
        self._g = 2.0 * (head.shape[1] + 16) * 2.0**-24

    def nbytes(self) -> int:
        """Bytes held beyond the head itself (:func:`extra_bytes` plans them)."""
        return _nbytes(self.approx) + _nbytes(self.m)

    def head_fn(self, x: torch.Tensor, norm: torch.Tensor, _lm_head: object, eps: float) -> torch.Tensor:
        """``LayerOps.head`` answering argmax ids ``[R]`` instead of logits ``[R, vocab]``."""
        return self.argmax(_rms_norm(x, norm, eps))

    def argmax(self, h: torch.Tensor) -> torch.Tensor:
        """``[R] int64``: the argmax of each row of ``h @ head.T`` for ``h [R, hidden]`` float32."""
        assert h.dim() == 2 and h.dtype == torch.float32, (h.shape, h.dtype)
        hb = h.to(torch.bfloat16)
        estimate = _linear(hb, self.approx)  # [R, vocab] bfloat16
        radius = self._radius(h, hb.float())  # [R]
        rows, ids = self._near_top(estimate, radius)
        e = estimate[rows, ids].float()
        bound = self.m[ids] * radius[rows] + e.abs() * _OUTPUT_ROUNDING
        floor = _per_row(rows, e - bound, h.shape[0], "amax")  # the largest exact logit is at least this
        keep = e + bound >= floor[rows]  # the shortlist: tokens that may hold the largest exact logit
        rows, ids = rows[keep], ids[keep]
        exact = (self.head[ids] * h[rows]).sum(dim=-1)  # a token's value does not depend on the shortlist
        best = _per_row(rows, exact, h.shape[0], "amax")
        return _per_row(rows, torch.where(exact == best[rows], ids, self.head.shape[0]), h.shape[0], "amin")

    def _near_top(self, estimate: torch.Tensor, radius: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(rows, ids)`` of every token whose bound may reach the row's best lower bound: within the top
        estimate's bound plus the largest bound any token of the row can have (four passes over the
        bfloat16 estimates; the exact bounds then only for these)."""
        top, top_id = estimate.max(dim=-1)
        top, low = top.float(), estimate.amin(dim=-1).float()
        widest = self.m_max * radius + torch.maximum(top.abs(), low.abs()) * _OUTPUT_ROUNDING
        below = top - (self.m[top_id] * radius + top.abs() * _OUTPUT_ROUNDING) - widest  # [R]
        return (estimate >= below[:, None]).nonzero(as_tuple=True)  # row by row, ids ascending

    def _radius(self, h: torch.Tensor, hb: torch.Tensor) -> torch.Tensor:
        """``[R]``: the bound's factor of ``m_j`` for each row."""
        l1, l1b = h.abs().sum(dim=-1), hb.abs().sum(dim=-1)
        return (hb - h).abs().sum(dim=-1) + 2.0**-9 * l1 + self._g * (l1 + l1b)


def _per_row(rows: torch.Tensor, values: torch.Tensor, num_rows: int, reduce: str) -> torch.Tensor:
    """``[num_rows]``: ``reduce`` (``amax`` | ``amin``) of ``values`` by their ``rows`` (every row has some)."""
    return values.new_empty((num_rows,)).scatter_reduce(0, rows, values, reduce, include_self=False)
