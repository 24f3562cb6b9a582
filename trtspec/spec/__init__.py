"""The draft-verify loop: acceptance rules, stop conditions, per-request stats.

No server and no model library here: runtimes, policies and detokenizers are
passed in through the protocols in :mod:`trtspec.spec.protocols`.
"""

from trtspec.spec.acceptance import greedy_accept, greedy_verify, rejection_sample, warp_probs
from trtspec.spec.loop import Generation, SpeculativeDecoder
from trtspec.spec.policy import FixedDraftLength
from trtspec.spec.protocols import (
    ArgmaxForward,
    Detokenizer,
    DraftLengthPolicy,
    DraftVerifier,
    LanguageModel,
    LMSession,
)
from trtspec.spec.types import (
    FinishReason,
    GenerationRequest,
    GenerationResult,
    IterationOutcome,
    SamplingParams,
    SpecStats,
    StopCriteria,
    StreamChunk,
)

__all__ = [
    "ArgmaxForward",
    "DraftVerifier",
    "Detokenizer",
    "DraftLengthPolicy",
    "FinishReason",
    "FixedDraftLength",
    "Generation",
    "GenerationRequest",
    "GenerationResult",
    "IterationOutcome",
    "LMSession",
    "LanguageModel",
    "SamplingParams",
    "SpecStats",
    "SpeculativeDecoder",
    "StopCriteria",
    "StreamChunk",
    "greedy_accept",
    "greedy_verify",
    "rejection_sample",
    "warp_probs",
]
