"""Turn the inputs of one ``spec_decode`` request into a validated :class:`ServeRequest`.

No Triton here: the model hands in a lookup ``name -> value`` (the input
tensor as a numpy array, else the request parameter of that name, else None),
so the rules are tested without a server. Every rule violation is an
:class:`~trtspec.errors.InvalidRequestError` with a one-line message, which
the model answers with ``INVALID_ARG``; nothing else may escape (the fuzz tests
of ``tests/reliability`` hold the parser to that).

Limits besides the obvious ones: ``text_input`` non-empty and at most
``max_text_bytes`` (checked before tokenizing); at most ``MAX_STOP_WORDS``
non-empty stop strings of at most ``MAX_STOP_WORD_CHARS`` characters; ``seed``
below 2**64 and ``top_k`` below 2**31 (the widths the models take). Two
normalisations keep the float32 sampling arithmetic finite without changing
what is sampled: a temperature below ``GREEDY_BELOW`` is greedy (vLLM's rule),
and a ``top_p`` below ``TOP_P_FLOOR`` is raised to it (both keep only the most
likely token).
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

MAX_STOP_WORDS = 64
MAX_STOP_WORD_CHARS = 256
MAX_SEED = 2**64 - 1
MAX_TOP_K = 2**31 - 1
GREEDY_BELOW = 1e-5  # temperatures in (0, GREEDY_BELOW) are greedy
TOP_P_FLOOR = 1e-30  # the smallest top_p float32 holds with room; below it only the top token survives anyway


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


def parse_request(
    get: Lookup, *, max_tokens_limit: int, request_id: str = "", max_text_bytes: int | None = None
) -> ServeRequest:
    """Read and check every input of the client interface (see ``protocol.SPEC_DECODE_INPUTS``)."""
    text = _text(get, "text_input", required=True)
    assert text is not None
    if not text:
        raise InvalidRequestError("text_input is empty")
    if max_text_bytes is not None and len(text) > max_text_bytes // 4:  # cheap first: >= 1 byte per char
        size = len(text.encode("utf-8"))
        if size > max_text_bytes:
            raise InvalidRequestError(f"text_input is {size} bytes; this server takes at most {max_text_bytes}")
    max_tokens = _int(get, "max_tokens", required=True)
    assert max_tokens is not None
    if max_tokens <= 0:
        raise InvalidRequestError(f"max_tokens must be > 0, got {_short(max_tokens)}")
    if max_tokens > max_tokens_limit:
        raise InvalidRequestError(
            f"max_tokens must be <= {max_tokens_limit} (this server's limit), got {_short(max_tokens)}"
        )
    stream = _bool(get, "stream")
    temperature = _float(get, "temperature")
    top_k = _int(get, "top_k")
    top_p = _float(get, "top_p")
    seed = _int(get, "seed")
    if seed is None:
        seed = _int(get, "random_seed")
    if seed is not None and not 0 <= seed <= MAX_SEED:
        raise InvalidRequestError(f"seed must be a non-negative integer < 2**64, got {_short(seed)}")
    if top_k is not None and not 0 <= top_k <= MAX_TOP_K:
        raise InvalidRequestError(f"top_k must be an integer >= 0 and <= {MAX_TOP_K} (0 disables it), got {_short(top_k)}")
    if temperature is not None and 0.0 < temperature < GREEDY_BELOW:
        temperature = 0.0
    if top_p is not None and 0.0 < top_p < TOP_P_FLOOR:
        top_p = TOP_P_FLOOR
    sampling = SamplingParams(
        temperature=0.0 if temperature is None else temperature,
        top_k=0 if top_k is None else top_k,
        top_p=1.0 if top_p is None else top_p,
        seed=seed,
    )
    sampling.validate()
    stop_words = tuple(w for w in _texts(get, "stop_words") if w)
    if len(stop_words) > MAX_STOP_WORDS:
        raise InvalidRequestError(f"at most {MAX_STOP_WORDS} stop_words, got {len(stop_words)}")
    long_stop = next((w for w in stop_words if len(w) > MAX_STOP_WORD_CHARS), None)
    if long_stop is not None:
        raise InvalidRequestError(f"a stop word may hold at most {MAX_STOP_WORD_CHARS} characters, got {len(long_stop)}")
    if any(w for w in _texts(get, "bad_words")):
        raise InvalidRequestError("bad_words is not supported by this server; send it empty or leave it out")
    priority = (_text(get, "priority") or "normal").strip().lower()
    if priority not in PRIORITIES:
        raise InvalidRequestError(f"priority must be one of {', '.join(PRIORITIES)}; got {_short(priority)}")
    spec_text = _text(get, "speculation")
    speculation = Speculation.auto
    if spec_text is not None and spec_text != "":
        try:
            speculation = Speculation(spec_text.strip().lower())
        except ValueError:
            choices = ", ".join(s.value for s in Speculation)
            raise InvalidRequestError(f"speculation must be one of {choices}; got {_short(spec_text)}") from None
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
    if vals[0] is None and required:  # a JSON null ([null]) is no value
        raise InvalidRequestError(f"input '{name}' is required")
    return vals[0]


def _decode(name: str, v: Any) -> str:
    if isinstance(v, bytes):
        try:
            return v.decode("utf-8")
        except UnicodeDecodeError:
            raise InvalidRequestError(f"input '{name}' is not valid UTF-8") from None
    if isinstance(v, str):
        try:
            v.encode("utf-8")  # a JSON parameter may carry lone surrogates ("\ud800")
        except UnicodeEncodeError:
            raise InvalidRequestError(f"input '{name}' is not valid UTF-8 (lone surrogate)") from None
        return str(v)
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
        raise InvalidRequestError(f"input '{name}' must be an integer, got {_short(v)}")
    return int(v)


def _float(get: Lookup, name: str) -> float | None:
    v = _scalar(get, name, False)
    if v is None:
        return None
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, float, np.integer, np.floating)):
        raise InvalidRequestError(f"input '{name}' must be a number, got {_short(v)}")
    try:
        f = float(v)
    except OverflowError:  # a JSON integer beyond float range
        raise InvalidRequestError(f"input '{name}' must be finite, got a {len(str(v))}-digit number") from None
    if not math.isfinite(f):
        raise InvalidRequestError(f"input '{name}' must be finite, got {f}")
    return f


def _bool(get: Lookup, name: str) -> bool | None:
    v = _scalar(get, name, False)
    if v is None:
        return None
    if not isinstance(v, (bool, np.bool_)):
        raise InvalidRequestError(f"input '{name}' must be a boolean, got {_short(v)}")
    return bool(v)


def _short(v: Any, limit: int = 40) -> str:
    """``repr(v)`` on one line, cut at ``limit`` characters (a message never carries a huge or multi-line value)."""
    try:
        text = repr(v)
    except Exception:
        text = f"<{type(v).__name__}>"
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."
