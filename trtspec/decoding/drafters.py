"""Which drafters a request gets, by its :class:`~trtspec.decoding.types.DrafterKind`.

- ``model``: the draft model (none deployed: the request runs on the target alone);
- ``ngram`` / ``suffix``: a free drafter, no draft model needed;
- ``auto``: the free drafter named by ``DrafterOptions.auto_free`` first, then the
  draft model when there is one; the policy chooses per iteration
  (:class:`~trtspec.decoding.protocols.DrafterChoice`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from trtspec.decoding import ngram, suffix
from trtspec.decoding.drafting import ModelDrafter
from trtspec.decoding.ngram import NgramDrafter
from trtspec.decoding.protocols import Drafter, LanguageModel
from trtspec.decoding.suffix import SuffixDrafter, SuffixStore
from trtspec.decoding.types import DrafterKind, GenerationRequest


@dataclass(frozen=True)
class DrafterOptions:
    """Settings of the free drafters (the policy file's ``drafters:`` section)."""

    __pydantic_config__ = {"extra": "forbid"}  # the policy file rejects unknown keys here too

    ngram_min: int = ngram.DEFAULT_MIN_N  # shortest n-gram matched
    ngram_max: int = ngram.DEFAULT_MAX_N  # longest n-gram matched (tried first)
    suffix_max_match: int = suffix.DEFAULT_MAX_MATCH  # longest suffix matched
    suffix_min_prob: float = suffix.DEFAULT_MIN_PROB  # stop drafting below this estimated chance
    suffix_max_spec_factor: float = suffix.DEFAULT_MAX_SPEC_FACTOR  # draft at most this times the match
    suffix_store_outputs: int = 64  # recent outputs the suffix drafter also matches (0: none)
    auto_free: DrafterKind = DrafterKind.SUFFIX  # the free drafter ``auto`` weighs against the model

    def __post_init__(self) -> None:
        if not 1 <= self.ngram_min <= self.ngram_max:
            raise ValueError(f"need 1 <= ngram_min <= ngram_max, got {self.ngram_min}, {self.ngram_max}")
        if self.suffix_max_match < 1 or not 0.0 < self.suffix_min_prob <= 1.0 or self.suffix_max_spec_factor <= 0:
            raise ValueError("need suffix_max_match >= 1, 0 < suffix_min_prob <= 1, suffix_max_spec_factor > 0")
        if self.suffix_store_outputs < 0:
            raise ValueError(f"suffix_store_outputs must be >= 0, got {self.suffix_store_outputs}")
        if not self.auto_free.free:
            raise ValueError(f"auto_free must be ngram or suffix, got {self.auto_free.value}")

    def make_store(self) -> SuffixStore | None:
        """The cross-request store of recent outputs, shared by a decoder's requests."""
        if self.suffix_store_outputs == 0:
            return None
        return SuffixStore(max_outputs=self.suffix_store_outputs, max_match=self.suffix_max_match)


def open_drafters(
    request: GenerationRequest,
    vocab_size: int,
    draft: LanguageModel | None,
    options: DrafterOptions,
    store: SuffixStore | None = None,
) -> list[Drafter]:
    """The drafters ``request`` asks for, in the order a policy should prefer them."""
    kind = request.drafter
    if kind is DrafterKind.MODEL:
        return [ModelDrafter(draft, request.request_id)] if draft is not None else []
    if kind is DrafterKind.NGRAM:
        return [NgramDrafter(vocab_size, options.ngram_min, options.ngram_max)]
    if kind is DrafterKind.SUFFIX:
        return [
            SuffixDrafter(
                vocab_size,
                prompt_len=len(request.prompt_ids),
                store=store,
                max_match=options.suffix_max_match,
                min_prob=options.suffix_min_prob,
                max_spec_factor=options.suffix_max_spec_factor,
            )
        ]
    assert kind is DrafterKind.AUTO, kind
    free = open_drafters(replace(request, drafter=options.auto_free), vocab_size, draft, options, store)
    return free + open_drafters(replace(request, drafter=DrafterKind.MODEL), vocab_size, draft, options, store)
