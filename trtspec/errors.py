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


class ModelCallError(TrtspecError):
    """A call to a served model (draft or target) failed: down, unloaded, or it answered an error."""


class ModelTimeoutError(ModelCallError):
    """A call to a served model missed its deadline (it may still finish; its result is unused)."""


def one_line(what: object) -> str:
    """The first line of an error (or message) for logs and client errors; never empty, never a traceback."""
    text = str(what).strip()
    if text:
        return text.splitlines()[0]
    return "unknown error" if isinstance(what, str) else type(what).__name__
