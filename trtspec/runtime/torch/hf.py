"""Any causal LM that ``transformers`` loads, behind the session protocol.

Slower per step than the lean runtime on CPU (module and cache-object
overhead), but it runs every architecture transformers knows. Rollback is
``DynamicCache.crop``.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence

import torch


class HFSession:
    def __init__(self, model: HFCausalLM, session_id: str = "") -> None:
        from transformers import DynamicCache

        self._model = model
        self.session_id = session_id
        self._cache: DynamicCache | None = DynamicCache(config=model.module.config)
        self._length = 0

    @property
    def num_cached(self) -> int:
        return self._length

    def forward(self, token_ids: Sequence[int], num_logits: int) -> torch.Tensor:
        if self._cache is None:
            raise RuntimeError(f"session {self.session_id!r} is closed")
        n = len(token_ids)
        if n == 0:
            raise ValueError("forward needs at least one token")
        if self._length + n > self._model.max_context:
            raise ValueError(f"sequence would hold {self._length + n} tokens; context is {self._model.max_context}")
        ids = torch.as_tensor([list(token_ids)], dtype=torch.int64, device=self._model.device)
        positions = torch.arange(self._length, self._length + n, device=self._model.device)
        with torch.inference_mode():
            out = self._model.module(
                input_ids=ids,
                **{self._model.cache_kwarg: self._cache},
                use_cache=True,
                cache_position=positions,
                logits_to_keep=max(num_logits, 1),
            )
        self._length += n
        logits = out.logits[0].float()  # [max(num_logits, 1), vocab]
        return logits[logits.shape[0] - num_logits :] if num_logits else logits[:0]

    def truncate(self, length: int) -> None:
        if self._cache is None:
            raise RuntimeError(f"session {self.session_id!r} is closed")
        if not 0 <= length <= self._length:
            raise ValueError(f"cannot truncate a cache of {self._length} tokens to {length}")
        if length < self._length:
            # A negative count removes that many tokens, in transformers 4.x and 5.x alike.
            self._cache.crop(length - self._length)
        self._length = length

    def close(self) -> None:
        self._cache = None


class HFCausalLM:
    """A ``transformers`` ``*ForCausalLM`` module."""

    def __init__(self, module: torch.nn.Module, max_context: int | None = None) -> None:
        self.module = module.eval()
        cfg = module.config
        self._vocab = int(module.get_output_embeddings().weight.shape[0])
        limit = int(getattr(cfg, "max_position_embeddings", 0) or 2048)
        self._max_context = min(max_context or limit, limit)
        self.device = next(module.parameters()).device
        # transformers renamed ``past_key_values`` to ``cache`` in 5.x.
        params = inspect.signature(module.forward).parameters
        self.cache_kwarg = "cache" if "cache" in params else "past_key_values"

    @property
    def vocab_size(self) -> int:
        return self._vocab

    @property
    def max_context(self) -> int:
        return self._max_context

    def new_session(self, session_id: str = "") -> HFSession:
        return HFSession(self, session_id)

    def weight_bytes(self) -> int:
        seen: set[int] = set()
        total = 0
        for p in self.module.parameters():
            if p.data_ptr() not in seen:
                seen.add(p.data_ptr())
                total += p.numel() * p.element_size()
        return total
