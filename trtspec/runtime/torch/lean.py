"""The lean Llama runtime as a :class:`~trtspec.spec.protocols.LanguageModel`."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from trtspec.runtime.torch.llama import KVCache, LlamaConfig, LlamaWeights, forward


class LeanSession:
    """One sequence on a :class:`LeanLlamaLM`: a preallocated KV cache."""

    def __init__(self, model: LeanLlamaLM, session_id: str = "") -> None:
        self._model = model
        self.session_id = session_id
        w = model.weights
        self._cache: KVCache | None = KVCache(w.cfg, w.dtype, w.device, min(model.initial_capacity, model.max_context))

    @property
    def num_cached(self) -> int:
        return self._live().length

    def _live(self) -> KVCache:
        if self._cache is None:
            raise RuntimeError(f"session {self.session_id!r} is closed")
        return self._cache

    def forward(self, token_ids: Sequence[int], num_logits: int) -> torch.Tensor:
        cache = self._live()
        if len(token_ids) == 0:
            raise ValueError("forward needs at least one token")
        if cache.length + len(token_ids) > self._model.max_context:
            raise ValueError(
                f"sequence would hold {cache.length + len(token_ids)} tokens; context is {self._model.max_context}"
            )
        with torch.inference_mode():
            return forward(self._model.weights, cache, token_ids, num_logits)

    def truncate(self, length: int) -> None:
        cache = self._live()
        if not 0 <= length <= cache.length:
            raise ValueError(f"cannot truncate a cache of {cache.length} tokens to {length}")
        cache.length = length  # positions >= length are overwritten by the next forward

    def close(self) -> None:
        self._cache = None

    @property
    def cache_bytes(self) -> int:
        return self._cache.nbytes() if self._cache is not None else 0


class LeanLlamaLM:
    """Llama-family model run by :mod:`trtspec.runtime.torch.llama`."""

    def __init__(self, weights: LlamaWeights, max_context: int | None = None, initial_capacity: int = 256):
        self.weights = weights
        self.cfg: LlamaConfig = weights.cfg
        self._max_context = min(max_context or weights.cfg.max_position_embeddings, weights.cfg.max_position_embeddings)
        self.initial_capacity = initial_capacity

    @property
    def vocab_size(self) -> int:
        return self.cfg.vocab_size

    @property
    def max_context(self) -> int:
        return self._max_context

    def new_session(self, session_id: str = "") -> LeanSession:
        return LeanSession(self, session_id)

    def weight_bytes(self) -> int:
        return self.weights.nbytes()
