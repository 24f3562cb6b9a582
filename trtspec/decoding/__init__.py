"""The draft-verify loop: acceptance rules, stop conditions, per-request stats.

No server and no model library here: runtimes, policies and detokenizers are
passed in through the protocols in :mod:`trtspec.decoding.protocols`.
"""

from trtspec.decoding.acceptance import greedy_accept, greedy_verify, rejection_sample, warp_probs
from trtspec.decoding.drafters import DrafterOptions
from trtspec.decoding.loop import Generation, SpeculativeDecoder
from trtspec.decoding.policy import FixedDraftLength
from trtspec.decoding.protocols import (
    ArgmaxForward,
    Detokenizer,
    Drafter,
    DrafterChoice,
    DraftLengthPolicy,
    DraftVerifier,
    LanguageModel,
    LMSession,
)
from trtspec.decoding.types import (
    AcceptanceRatios,
    DrafterKind,
    FinishReason,
    GenerationRequest,
    GenerationResult,
    IterationOutcome,
    LogitBias,
    Penalties,
    SamplingParams,
    SpecStats,
    StopCriteria,
    StreamChunk,
)

__all__ = [
    "AcceptanceRatios",
    "ArgmaxForward",
    "DraftVerifier",
    "Detokenizer",
    "Drafter",
    "DrafterChoice",
    "DrafterKind",
    "DrafterOptions",
    "DraftLengthPolicy",
    "FinishReason",
    "FixedDraftLength",
    "Generation",
    "GenerationRequest",
    "GenerationResult",
    "IterationOutcome",
    "LMSession",
    "LanguageModel",
    "LogitBias",
    "Penalties",
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
