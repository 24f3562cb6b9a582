"""The simplest draft-length policy: a constant ``k``.

Adaptive policies (step, heuristic, goodput) live in ``trtspec.control``; they
implement the same :class:`~trtspec.decoding.protocols.DraftLengthPolicy`.
"""

from __future__ import annotations

from dataclasses import dataclass

from trtspec.errors import InvalidRequestError
from trtspec.decoding.types import IterationOutcome


@dataclass
class FixedDraftLength:
    """Always draft ``k`` tokens; ``k == 0`` is plain target decoding."""

    k: int

    def __post_init__(self) -> None:
        if not isinstance(self.k, int) or self.k < 0:
            raise InvalidRequestError(f"draft length k must be an integer >= 0, got {self.k!r}")

    def next_k(self) -> int:
        return self.k

    def observe(self, outcome: IterationOutcome) -> None:
        return None
