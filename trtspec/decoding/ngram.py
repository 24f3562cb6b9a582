"""The ``ngram`` drafter: prompt lookup decoding.

Rule (Saxena 2023, "Prompt Lookup Decoding"; transformers'
``prompt_lookup_num_tokens``, vLLM's ``ngram`` proposer): for ``n`` from
``max_n`` down to ``min_n``, look for an earlier occurrence of the last ``n``
tokens of the sequence (prompt and output so far); at the first ``n`` that
occurs, propose the ``k`` tokens that followed its most recent occurrence.
Nothing occurs: no proposal (the iteration is a plain target step).

It costs no model call. An index maps every n-gram of the last ``window``
tokens to where it last ended; it grows by ``max_n - min_n + 1`` entries per
new token and drops those of tokens that leave the window, so time per
proposal and memory are bounded however long the sequence grows.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from trtspec.decoding.drafting import deterministic_proposal
from trtspec.decoding.types import Proposal, SamplingParams

DEFAULT_MIN_N = 2
DEFAULT_MAX_N = 4
DEFAULT_WINDOW = 8192


class NgramDrafter:
    """Prompt lookup over one request's tokens (see the module docstring)."""

    name = "ngram"

    def __init__(
        self,
        vocab_size: int,
        min_n: int = DEFAULT_MIN_N,
        max_n: int = DEFAULT_MAX_N,
        window: int = DEFAULT_WINDOW,
    ) -> None:
        if not 1 <= min_n <= max_n:
            raise ValueError(f"ngram sizes need 1 <= min_n <= max_n, got min_n={min_n}, max_n={max_n}")
        if window <= max_n:
            raise ValueError(f"ngram window must exceed max_n={max_n}, got {window}")
        self.vocab_size = vocab_size
        self.min_n, self.max_n, self.window = min_n, max_n, window
        self._last_end: dict[tuple[int, ...], int] = {}  # n-gram -> index of its last token, latest occurrence
        self._indexed = 0  # n-grams ending before this index are in the index
        self._dropped = 0  # n-grams ending before this index have left the window

    @property
    def index_size(self) -> int:
        """Entries in the index (bounded by ``window * (max_n - min_n + 1)``)."""
        return len(self._last_end)

    def propose(
        self, tokens: Sequence[int], k: int, sampling: SamplingParams, generator: torch.Generator | None
    ) -> Proposal:
        end = len(tokens)
        self._index(tokens, end - 1)  # every n-gram but the ones ending at the last token (the query itself)
        for n in range(min(self.max_n, end - 1), self.min_n - 1, -1):
            last = self._last_end.get(tuple(tokens[end - n :]))
            if last is not None:
                return deterministic_proposal(tokens[last + 1 : last + 1 + k], sampling, self.vocab_size)
        return Proposal(tokens=(), q=None)

    def rollback(self, length: int) -> None:
        return None  # it indexes committed tokens only; nothing to drop

    def close(self) -> None:
        self._last_end.clear()

    def _index(self, tokens: Sequence[int], stop: int) -> None:
        """Index the n-grams ending before ``stop``; drop those ending before ``stop - window``."""
        lo = stop - self.window
        for j in range(self._dropped, min(lo, self._indexed)):
            for key in self._ngrams_ending_at(tokens, j):
                if self._last_end.get(key) == j:  # not seen again since
                    del self._last_end[key]
        self._dropped = max(self._dropped, lo)
        for j in range(max(self._indexed, lo), stop):
            for key in self._ngrams_ending_at(tokens, j):
                self._last_end[key] = j
        self._indexed = max(self._indexed, stop)

    def _ngrams_ending_at(self, tokens: Sequence[int], j: int) -> list[tuple[int, ...]]:
        return [tuple(tokens[j - n + 1 : j + 1]) for n in range(self.min_n, min(self.max_n, j + 1) + 1)]
