"""The lean Llama runtime as a :class:`~trtspec.decoding.protocols.LanguageModel`.

Passes are shaped by a :class:`~trtspec.runtime.torch.shapes.ShapePlan`
(exact mode, graph buckets, or unpadded). With graphs (CUDA), every
static-shape pass replays a captured step that reads and writes ONE resident
KV cache per model; a session is moved into it when it runs and out of it when
another session of the same model runs (a copy of its cached tokens), so a
single request, the common case in-process, never copies.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import torch

from trtspec.runtime.torch import argmax
from trtspec.runtime.torch.llama import (
    EAGER,
    PAD_POSITIONS,
    KVCache,
    LayerOps,
    LlamaConfig,
    LlamaWeights,
    causal_mask,
    forward,
    kv_dtype,
)
from trtspec.runtime.torch.shapes import Capture, GraphCache, ShapePlan, Step


class LeanSession:
    """One sequence on a :class:`LeanLlamaLM`: a preallocated KV cache."""

    def __init__(self, model: LeanLlamaLM, session_id: str = "") -> None:
        self._model = model
        self.session_id = session_id
        self._closed = False
        self._cache = model.new_cache(min(model.initial_capacity, model.cache_limit))

    @property
    def num_cached(self) -> int:
        return self._live().length

    def _live(self) -> KVCache:
        if self._closed:
            raise RuntimeError(f"session {self.session_id!r} is closed")
        return self._cache

    def forward(self, token_ids: Sequence[int], num_logits: int) -> torch.Tensor:
        rows = self._run(token_ids, num_logits, greedy=False)
        if not rows:
            return torch.empty((0, self._model.vocab_size), dtype=torch.float32)
        return torch.cat(rows) if len(rows) > 1 else rows[0]

    def forward_argmax(self, token_ids: Sequence[int], num_logits: int) -> list[int]:
        """``forward(...).argmax(-1)``; through the model's :class:`~trtspec.runtime.torch.argmax.ArgmaxHead`
        where it has one (the greedy token without the whole float32 LM head)."""
        if self._model.argmax_head is None:
            return self.forward(token_ids, num_logits).argmax(dim=-1).tolist()
        return [int(t) for rows in self._run(token_ids, num_logits, greedy=True) for t in rows]

    def _run(self, token_ids: Sequence[int], num_logits: int, greedy: bool) -> list[torch.Tensor]:
        """Append ``token_ids``; the last ``num_logits`` rows' logits (``greedy``: argmax ids), pass by pass."""
        cache = self._live()
        n = len(token_ids)
        if n == 0:
            raise ValueError("forward needs at least one token")
        if cache.length + n > self._model.max_context:
            raise ValueError(f"sequence would hold {cache.length + n} tokens; context is {self._model.max_context}")
        assert 0 <= num_logits <= n
        model = self._model
        with torch.inference_mode():
            cache = model.bind(self)
            rows: list[torch.Tensor] = []
            done = 0
            for size in model.plan.chunks(n):
                first = max(0, n - num_logits - done)  # first row of this chunk whose logits are wanted
                out = model.run_pass(cache, token_ids[done : done + size], first if first < size else None, greedy)
                if out is not None:
                    rows.append(out)
                done += size
        return rows

    def truncate(self, length: int) -> None:
        cache = self._live()
        if not 0 <= length <= cache.length:
            raise ValueError(f"cannot truncate a cache of {cache.length} tokens to {length}")
        cache.length = length  # slots >= length are overwritten by the next forward

    def move_out(self) -> None:
        """Leave the model's resident cache: keep a copy of the cached tokens."""
        own = self._model.new_cache(max(self._cache.length, 1))
        own.copy_prefix_from(self._cache)
        self._cache = own

    def move_into(self, resident: KVCache) -> KVCache:
        """Continue in the model's resident cache (``resident`` takes this session's tokens)."""
        resident.copy_prefix_from(self._cache)
        self._cache = resident
        return resident

    def close(self) -> None:
        self._closed = True
        self._model.release(self)

    @property
    def cache_bytes(self) -> int:
        return 0 if self._closed or self._model.holds(self) else self._cache.nbytes()


class LeanLlamaLM:
    """Llama-family model run by :mod:`trtspec.runtime.torch.llama`.

    ``exact``: every pass has :data:`~trtspec.runtime.torch.shapes.EXACT_ROWS`
    rows (or ``exact_rows``), see :mod:`trtspec.runtime.torch.shapes`.
    ``graphs``: static-shape passes replay captured steps, one per shape;
    ``capture`` makes them (default: compiled layers in a CUDA graph, which
    needs CUDA; tests pass a recorder). The plan must then be static.
    ``ops``: the layer functions captured steps run (default: compiled for
    CUDA graphs, eager with a custom ``capture``).
    """

    def __init__(
        self,
        weights: LlamaWeights,
        max_context: int | None = None,
        initial_capacity: int = 256,
        plan: ShapePlan | None = None,
        graphs: bool = False,
        capture: Capture | None = None,
        ops: LayerOps | None = None,
    ):
        self.weights = weights
        self.cfg: LlamaConfig = weights.cfg
        self._max_context = min(max_context or weights.cfg.max_position_embeddings, weights.cfg.max_position_embeddings)
        self.initial_capacity = initial_capacity
        self.plan = plan or ShapePlan()
        assert self.plan.max_rows <= PAD_POSITIONS, f"passes hold at most {PAD_POSITIONS} rows"
        self._resident: LeanSession | None = None
        self._static: KVCache | None = None
        self.graphs: GraphCache | None = None
        self._ops = ops or (LayerOps.compiled() if graphs and capture is None else EAGER)
        if self._ops is not EAGER and weights.packed:
            raise ValueError("compiled layers cannot read packed matrices: build the weights with pack=False")
        self.argmax_head = (argmax.ArgmaxHead(weights.embed)  # greedy passes' argmax (CPU, float32)
                            if argmax.applies(weights.dtype, weights.device.type, weights.tied) else None)
        self._greedy_ops = replace(EAGER, head=self.argmax_head.head_fn) if self.argmax_head else EAGER
        if graphs:
            assert self.plan.static, "graphs need static shapes (exact mode or rows buckets)"
            self._static = self.new_cache(self.cache_limit)
            self.graphs = GraphCache(self._step_for, capture) if capture else self._cuda_graphs()

    @property
    def vocab_size(self) -> int:
        return self.cfg.vocab_size

    @property
    def max_context(self) -> int:
        return self._max_context

    @property
    def exact(self) -> bool:
        return self.plan.exact_rows is not None

    @property
    def cache_limit(self) -> int:
        """Most slots a cache holds: the context plus room for padding rows."""
        return self._max_context + self.plan.max_rows

    def new_session(self, session_id: str = "") -> LeanSession:
        return LeanSession(self, session_id)

    def new_cache(self, capacity: int) -> KVCache:
        w = self.weights
        return KVCache(self.cfg, kv_dtype(w.dtype, w.device.type), w.device, capacity)

    def weight_bytes(self) -> int:
        return self.weights.nbytes() + (self.argmax_head.nbytes() if self.argmax_head else 0)

    def capture_common(self) -> None:
        """Capture the shapes every request meets: decode and verify rows over the smallest window."""
        assert self.graphs is not None
        window = self.plan.window(self.plan.max_rows, self.cache_limit)
        for rows in [self.plan.exact_rows] if self.exact else self.plan.rows_buckets[:2]:
            assert rows is not None
            self.graphs.get(rows, window)

    # -- passes -------------------------------------------------------------

    def run_pass(
        self, cache: KVCache, token_ids: Sequence[int], first: int | None, greedy: bool = False
    ) -> torch.Tensor | None:
        """Append ``token_ids`` (one pass) to ``cache``; logits of rows ``first:`` (``None``: none wanted),
        or with ``greedy`` their argmax ids through :attr:`argmax_head` (which the model must have)."""
        w, n, start = self.weights, len(token_ids), cache.length
        ops = self._greedy_ops if greedy else EAGER
        assert not greedy or self.argmax_head is not None
        rows = self.plan.rows(n)
        if rows is None:  # unpadded: exactly the cached keys, no mask for a single row
            cache.reserve(start + n, self.cache_limit)
            pos = torch.arange(start, start + n, device=w.device)
            ids = torch.as_tensor(list(token_ids), dtype=torch.int64, device=w.device)
            mask = causal_mask(pos, start + n) if n > 1 else None
            out = forward(w, cache, ids, pos, start + n, mask, first, ops)
        else:
            window = self.plan.window(start + rows, self.cache_limit)
            cache.reserve(window, self.cache_limit)
            pos = torch.arange(start, start + rows, device=w.device)
            ids = torch.as_tensor(list(token_ids) + [0] * (rows - n), dtype=torch.int64, device=w.device)
            if self.graphs is not None:
                assert cache is self._static and not greedy
                all_rows = self.graphs.run(ids, pos, window)
                out = all_rows[first:n] if first is not None else None
            else:
                all_rows = forward(w, cache, ids, pos, window, causal_mask(pos, window), 0 if first is not None else None,
                                   ops)
                out = all_rows[first:n] if all_rows is not None else None
        cache.length = start + n
        return out

    # -- the resident cache (graphs) -----------------------------------------

    def bind(self, session: LeanSession) -> KVCache:
        """The cache ``session`` runs in: its own, or (graphs) the resident one, moving sessions as needed."""
        if self._static is None or self._resident is session:
            return session._cache
        if self._resident is not None:
            self._resident.move_out()
        self._resident = session
        return session.move_into(self._static)

    def holds(self, session: LeanSession) -> bool:
        return self._resident is session

    def release(self, session: LeanSession) -> None:
        if self._resident is session:
            self._resident = None

    def _step_for(self, rows: int, window: int) -> Step:
        assert self._static is not None
        static, w, ops = self._static, self.weights, self._ops

        def step(ids: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
            out = forward(w, static, ids, pos, window, causal_mask(pos, window), 0, ops)
            assert out is not None
            return out

        return step

    def _cuda_graphs(self) -> GraphCache:
        if self.weights.device.type != "cuda":
            raise ValueError("CUDA graphs need a CUDA device")
        self._pool = torch.cuda.graph_pool_handle()
        dev = self.weights.device
        def memory() -> int:  # what the graphs' pool holds, not blocks cached for others
            torch.cuda.empty_cache()
            return torch.cuda.memory_reserved(dev)

        return GraphCache(self._step_for, self._capture_cuda, memory=memory)

    def _capture_cuda(self, step: Step, rows: int, window: int) -> Step:
        """Warm ``step`` up (compiling its layers), capture it as a CUDA graph; return its replay."""
        assert self._static is not None
        static, dev = self._static, self.weights.device
        ids = torch.zeros(rows, dtype=torch.int64, device=dev)
        pos = torch.arange(window - rows, window, device=dev)  # slots the warm-up may scribble on ...
        saved_k = static.k[:, :, window - rows : window].clone()  # ... and gets back afterwards
        saved_v = static.v[:, :, window - rows : window].clone()
        side = torch.cuda.Stream(dev)
        side.wait_stream(torch.cuda.current_stream(dev))
        with torch.cuda.stream(side):
            for _ in range(3):
                step(ids, pos)
        torch.cuda.current_stream(dev).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            out = step(ids, pos)
        static.k[:, :, window - rows : window] = saved_k
        static.v[:, :, window - rows : window] = saved_v

        def replay(new_ids: torch.Tensor, new_pos: torch.Tensor) -> torch.Tensor:
            ids.copy_(new_ids)
            pos.copy_(new_pos)
            graph.replay()
            return out.clone()

        return replay
