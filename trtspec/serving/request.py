"""Turn the inputs of one ``spec_decode`` request into a validated :class:`ServeRequest`.

No Triton here: the model hands in a lookup ``name -> value`` (the input
tensor as a numpy array, else the request parameter of that name, else None),
so the rules are tested without a server. Every rule violation is an
:class:`~trtspec.errors.InvalidRequestError` with a one-line message, which
the model answers with ``INVALID_ARG``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from trtspec.errors import InvalidRequestError
from trtspec.protocol import PRIORITIES, Speculation
from trtspec.spec.types import SamplingParams

Lookup = Callable[[str], Any]  # numpy array (an input tensor), a JSON scalar/list (a parameter), or None


@dataclass(frozen=True)
class ServeRequest:
    """One client request, validated (prompt not yet tokenized)."""

    text: str
    max_tokens: int
    stream: bool = False
    sampling: SamplingParams = SamplingParams()
    stop_words: tuple[str, ...] = ()
    priority: str = "normal"  # high | normal | low
    speculation: Speculation = Speculation.auto
    request_id: str = ""

    @classmethod
    def make_dummy(cls, text: str = "Hello world", max_tokens: int = 4) -> ServeRequest:
        return cls(text=text, max_tokens=max_tokens)


def parse_request(get: Lookup, *, max_tokens_limit: int, request_id: str = "") -> ServeRequest:
    """Read and check every input of the client interface (see ``protocol.SPEC_DECODE_INPUTS``)."""
    text = _text(get, "text_input", required=True)
    assert text is not None
    max_tokens = _int(get, "max_tokens", required=True)
    assert max_tokens is not None
    if max_tokens <= 0:
        raise InvalidRequestError(f"max_tokens must be > 0, got {max_tokens}")
    if max_tokens > max_tokens_limit:
        raise InvalidRequestError(f"max_tokens must be <= {max_tokens_limit} (this server's limit), got {max_tokens}")
    stream = _bool(get, "stream")
    temperature = _float(get, "temperature")
    top_k = _int(get, "top_k")
    top_p = _float(get, "top_p")
    seed = _int(get, "seed")
    if seed is None:
        seed = _int(get, "random_seed")
    sampling = SamplingParams(
        temperature=0.0 if temperature is None else temperature,
        top_k=0 if top_k is None else top_k,
        top_p=1.0 if top_p is None else top_p,
        seed=seed,
    )
    sampling.validate()
    stop_words = tuple(w for w in _texts(get, "stop_words") if w)
    if any(w for w in _texts(get, "bad_words")):
        raise InvalidRequestError("bad_words is not supported by this server; send it empty or leave it out")
    priority = (_text(get, "priority") or "normal").strip().lower()
    if priority not in PRIORITIES:
        raise InvalidRequestError(f"priority must be one of {', '.join(PRIORITIES)}; got {priority!r}")
    spec_text = _text(get, "speculation")
    speculation = Speculation.auto
    if spec_text is not None and spec_text != "":
        try:
            speculation = Speculation(spec_text.strip().lower())
        except ValueError:
            choices = ", ".join(s.value for s in Speculation)
            raise InvalidRequestError(f"speculation must be one of {choices}; got {spec_text!r}") from None
    return ServeRequest(
        text=text,
        max_tokens=max_tokens,
        stream=bool(stream),
        sampling=sampling,
        stop_words=stop_words,
        priority=priority,
        speculation=speculation,
        request_id=request_id,
    )


# -- one value of one input ---------------------------------------------------


def _values(get: Lookup, name: str) -> list | None:
    """The values of ``name`` as a flat list (None: not given)."""
    v = get(name)
    if v is None:
        return None
    if isinstance(v, np.ndarray):
        return v.reshape(-1).tolist() if v.dtype != object else list(v.reshape(-1))
    if isinstance(v, (list, tuple)):
        return list(v)
    return [v]


def _scalar(get: Lookup, name: str, required: bool) -> Any:
    vals = _values(get, name)
    if vals is None:
        if required:
            raise InvalidRequestError(f"input '{name}' is required")
        return None
    if len(vals) != 1:
        raise InvalidRequestError(
            f"input '{name}' must hold one value (one prompt per request, batch size 1), got {len(vals)}"
        )
    return vals[0]


def _decode(name: str, v: Any) -> str:
    if isinstance(v, bytes):
        try:
            return v.decode("utf-8")
        except UnicodeDecodeError:
            raise InvalidRequestError(f"input '{name}' is not valid UTF-8") from None
    if isinstance(v, str):
        return v
    raise InvalidRequestError(f"input '{name}' must be a string, got {type(v).__name__}")


def _text(get: Lookup, name: str, required: bool = False) -> str | None:
    v = _scalar(get, name, required)
    return None if v is None else _decode(name, v)


def _texts(get: Lookup, name: str) -> list[str]:
    vals = _values(get, name)
    return [] if vals is None else [_decode(name, v) for v in vals]


def _int(get: Lookup, name: str, required: bool = False) -> int | None:
    v = _scalar(get, name, required)
    if v is None:
        return None
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
        if isinstance(v, (float, np.floating)) and float(v).is_integer():
            return int(v)  # a JSON parameter like 16.0
        raise InvalidRequestError(f"input '{name}' must be an integer, got {v!r}")
    return int(v)


def _float(get: Lookup, name: str) -> float | None:
    v = _scalar(get, name, False)
    if v is None:
        return None
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, float, np.integer, np.floating)):
        raise InvalidRequestError(f"input '{name}' must be a number, got {v!r}")
    f = float(v)
    if not math.isfinite(f):
        raise InvalidRequestError(f"input '{name}' must be finite, got {f}")
    return f


def _bool(get: Lookup, name: str) -> bool | None:
    v = _scalar(get, name, False)
    if v is None:
        return None
    if not isinstance(v, (bool, np.bool_)):
        raise InvalidRequestError(f"input '{name}' must be a boolean, got {v!r}")
    return bool(v)
