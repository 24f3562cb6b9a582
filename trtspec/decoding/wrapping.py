"""Bases for wrappers around a model: each forwards what it does not change to ``inner``.

Fault injectors (:mod:`trtspec.testing.faults`), the serving guard
(:mod:`trtspec.serving.guard`) and the test fakes wrap a
:class:`~trtspec.decoding.protocols.LanguageModel` and its sessions; they
subclass these and override only the calls they change.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from trtspec.decoding.protocols import LanguageModel, LMSession

if TYPE_CHECKING:
    import torch


class ModelWrapper:
    """A model around ``inner``: its vocabulary and context; subclasses wrap ``new_session``."""

    def __init__(self, inner: LanguageModel) -> None:
        self.inner = inner

    @property
    def vocab_size(self) -> int:
        return self.inner.vocab_size

    @property
    def max_context(self) -> int:
        return self.inner.max_context


class SessionWrapper:
    """A session around ``inner``: every call goes to it unless a subclass overrides it."""

    def __init__(self, inner: LMSession) -> None:
        self.inner = inner

    @property
    def num_cached(self) -> int:
        return self.inner.num_cached

    def forward(self, token_ids: Sequence[int], num_logits: int) -> torch.Tensor:
        return self.inner.forward(token_ids, num_logits)

    def truncate(self, length: int) -> None:
        self.inner.truncate(length)

    def close(self) -> None:
        self.inner.close()
