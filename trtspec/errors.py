"""Domain errors shared by every layer.

Each carries a one-line, human message; the CLI prints it as is and the Triton
models map it to an error code (``InvalidRequestError`` -> INVALID_ARG, ...).
"""

from __future__ import annotations


class TrtspecError(Exception):
    """Base of every error trtspec raises on purpose."""


class InvalidRequestError(TrtspecError, ValueError):
    """A generation request is malformed (empty prompt, max tokens <= 0, ...)."""


class IncompatibleModelsError(TrtspecError):
    """Draft and target cannot be paired (vocabulary, tokenizer, context)."""


class CheckpointError(TrtspecError):
    """A model checkpoint is missing, unreadable or of an unsupported kind."""


class ContextOverflowError(InvalidRequestError):
    """The prompt does not fit in the model's context window."""


class DraftError(TrtspecError):
    """The draft model failed or timed out; the caller continues on the target alone."""
