"""Turn the inputs of one ``spec_decode`` request into a validated :class:`ServeRequest`.

No Triton here: the model hands in a lookup ``name -> value`` (the input
tensor as a numpy array, else the request parameter of that name, else None),
so the rules are tested without a server. Every rule violation is an
:class:`~trtspec.errors.InvalidRequestError` with a one-line message, which
the model answers with ``INVALID_ARG``; nothing else may escape (the fuzz tests
of ``tests/reliability`` hold the parser to that).

Limits besides the obvious ones: ``text_input`` non-empty and at most
``max_text_bytes`` (checked before tokenizing); at most ``MAX_STOP_WORDS``
non-empty stop words (and as many bad words) of at most ``MAX_STOP_WORD_CHARS`` characters; ``seed``
below 2**64 and ``top_k`` below 2**31 (the widths the models take). Two
normalisations keep the float32 sampling arithmetic finite without changing
what is sampled: a temperature below ``GREEDY_BELOW`` is greedy (vLLM's rule),
and a ``top_p`` below ``TOP_P_FLOOR`` is raised to it (both keep only the most
likely token).
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

from trtspec.errors import InvalidRequestError
from trtspec.wire import Priority, Speculation
from trtspec.decoding.types import MAX_TOP_LOGPROBS, DrafterKind, LogitBias, Penalties, SamplingParams

E = TypeVar("E", bound=enum.Enum)
Lookup = Callable[[str], Any]  # numpy array (an input tensor), a JSON scalar/list (a parameter), or None

MAX_STOP_WORDS = 64
MAX_STOP_WORD_CHARS = 256
MAX_SEED = 2**64 - 1
MAX_TOP_K = 2**31 - 1
MAX_LOGIT_BIAS = 1024  # logit_bias_ids per request
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
    bad_words: tuple[str, ...] = ()  # TensorRT-LLM's: words the text never contains (tokenized by the model)
    # TensorRT-LLM's embedding bias: (word, weight), added to each of the word's tokens' logits (tokenized by
    # the model, summed with sampling.logit_bias)
    bias_words: tuple[tuple[str, float], ...] = ()
    priority: Priority = Priority.NORMAL
    speculation: Speculation = Speculation.AUTO
    apply_chat_template: bool | None = None  # None: the model's parameter decides
    end_id: int | None = None  # TensorRT-LLM's end_id: the only EOS token; -1: none (None: the tokenizer's)
    echo_prompt: bool = False  # the whole answer starts with ``text`` (exclude_input_in_output false)
    max_draft_tokens: int | None = None  # TensorRT-LLM's num_draft_tokens: at most this many per step
    min_tokens: int = 0  # TensorRT-LLM's min_length / min_tokens: no EOS among the first this many tokens
    request_id: str = ""
    drafter: DrafterKind | None = None  # None: the model's default_drafter
    logprobs: bool = False  # TensorRT-LLM's return_log_probs: output_log_probs and cum_log_probs sent
    top_logprobs: int = 0  # with logprobs: the most likely tokens at each position too (top_output_ids, top_log_probs)

    @classmethod
    def make_dummy(cls, text: str = "Hello world", max_tokens: int = 4) -> ServeRequest:
        return cls(text=text, max_tokens=max_tokens)


def parse_request(
    get: Lookup, *, max_tokens_limit: int, request_id: str = "", max_text_bytes: int | None = None,
    default_exact: bool = False,
) -> ServeRequest:
    """Read and check every input of the client interface (see ``wire.SPEC_DECODE_INPUTS``).

    ``default_exact``: the sampling rule of a request that does not send ``exact`` (the policy's ``exact``)."""
    text = _text_input(get, max_text_bytes)
    max_tokens = _max_tokens(get, max_tokens_limit)
    stream = _bool(get, "stream")
    logit_bias, bias_words = _logit_bias(get)
    sampling = _sampling(get, default_exact, logit_bias)
    stop_words = _words(get, "stop_words")
    bad_words = _words(get, "bad_words")
    priority = _choice(get, "priority", Priority, Priority.NORMAL)
    speculation = _choice(get, "speculation", Speculation, Speculation.AUTO)
    refuse_unsupported(get)
    speculation, max_draft = _draft_tokens(get, speculation)
    end_id = _int(get, "end_id")
    if end_id is not None and end_id < -1:
        raise InvalidRequestError(f"end_id must be a token id, or -1 for none; got {_short(end_id)}")
    drafter = _choice(get, "drafter", DrafterKind, None)  # None: the model's default_drafter
    min_tokens = _min_tokens(get, max_tokens)
    return ServeRequest(
        text=text,
        max_tokens=max_tokens,
        stream=bool(stream),
        sampling=sampling,
        stop_words=stop_words,
        bad_words=bad_words,
        bias_words=bias_words,
        priority=priority,
        speculation=speculation,
        apply_chat_template=_bool(get, "apply_chat_template"),
        end_id=end_id,
        echo_prompt=_bool(get, "exclude_input_in_output") is False and not stream,
        max_draft_tokens=max_draft or None,
        min_tokens=min_tokens,
        request_id=request_id,
        drafter=drafter,
        **_logprobs(get),
    )


def _text_input(get: Lookup, max_text_bytes: int | None) -> str:
    text = _text(get, "text_input", required=True)
    assert text is not None
    if not text:
        raise InvalidRequestError("text_input is empty")
    if max_text_bytes is not None and len(text) > max_text_bytes // 4:  # cheap first: >= 1 byte per char
        size = len(text.encode("utf-8"))
        if size > max_text_bytes:
            raise InvalidRequestError(f"text_input is {size} bytes; this server takes at most {max_text_bytes}")
    return text


def _max_tokens(get: Lookup, max_tokens_limit: int) -> int:
    max_tokens = _int(get, "max_tokens", required=True)
    assert max_tokens is not None
    if max_tokens <= 0:
        raise InvalidRequestError(f"max_tokens must be > 0, got {_short(max_tokens)}")
    if max_tokens > max_tokens_limit:
        raise InvalidRequestError(
            f"max_tokens must be <= {max_tokens_limit} (this server's limit), got {_short(max_tokens)}"
        )
    return max_tokens


def _sampling(get: Lookup, default_exact: bool, logit_bias: LogitBias) -> SamplingParams:
    """``temperature``, ``top_k``, ``top_p``, ``seed`` (or ``random_seed``), ``exact`` and the
    penalties, with TensorRT-LLM's meanings of the edge values; and ``logit_bias``."""
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
    if top_p == 0.0:  # TensorRT-LLM's meaning: top-p off; with top-k off as well, greedy
        top_p = 1.0
        temperature = 0.0 if not top_k else temperature
    exact = _bool(get, "exact")
    sampling = SamplingParams(
        temperature=0.0 if temperature is None else temperature,
        top_k=0 if top_k is None else top_k,
        top_p=1.0 if top_p is None else top_p,
        seed=seed,
        exact=default_exact if exact is None else exact,
        penalties=Penalties.from_inputs(lambda name: _float(get, name)),
        logit_bias=logit_bias,
    )
    sampling.validate()
    return sampling


def _words(get: Lookup, name: str) -> tuple[str, ...]:
    """``stop_words`` or ``bad_words``: the non-empty ones (:func:`_check_words`)."""
    return _check_words(tuple(w for w in _texts(get, name) if w), name)


def _check_words(words: tuple[str, ...], name: str) -> tuple[str, ...]:
    """``words``, at most ``MAX_STOP_WORDS`` of at most ``MAX_STOP_WORD_CHARS`` characters."""
    if len(words) > MAX_STOP_WORDS:
        raise InvalidRequestError(f"at most {MAX_STOP_WORDS} {name}, got {len(words)}")
    long = next((w for w in words if len(w) > MAX_STOP_WORD_CHARS), None)
    if long is not None:
        raise InvalidRequestError(f"a word of {name} may hold at most {MAX_STOP_WORD_CHARS} characters, "
                                  f"got {len(long)}")
    return words


def _min_tokens(get: Lookup, max_tokens: int) -> int:
    """``min_tokens``, or TensorRT-LLM's older name ``min_length`` (both given: the same value)."""
    given = {name: v for name in ("min_tokens", "min_length") if (v := _int(get, name)) is not None}
    if len(set(given.values())) > 1:
        raise InvalidRequestError(f"min_tokens {given['min_tokens']} and min_length {given['min_length']} differ; "
                                  "send one of them")
    name, value = next(iter(given.items()), ("min_tokens", 0))
    if not 0 <= value <= max_tokens:
        raise InvalidRequestError(f"{name} must be >= 0 and <= max_tokens ({max_tokens}), got {_short(value)}")
    return value


def _logprobs(get: Lookup) -> dict[str, Any]:
    """``return_log_probs`` and ``top_logprobs`` (0..MAX_TOP_LOGPROBS, with return_log_probs on)."""
    logprobs, top = bool(_bool(get, "return_log_probs")), _int(get, "top_logprobs") or 0
    if not 0 <= top <= MAX_TOP_LOGPROBS:
        raise InvalidRequestError(f"top_logprobs must be >= 0 and <= {MAX_TOP_LOGPROBS}, got {_short(top)}")
    if top and not logprobs:
        raise InvalidRequestError(f"top_logprobs {top} needs return_log_probs true")
    return {"logprobs": logprobs, "top_logprobs": top}


def _logit_bias(get: Lookup) -> tuple[LogitBias, tuple[tuple[str, float], ...]]:
    """``logit_bias_ids`` with ``logit_bias_values`` (one value per id, at most ``MAX_LOGIT_BIAS``), and
    TensorRT-LLM's ``embedding_bias_words`` with ``embedding_bias_weights`` (one weight per word; empty
    words, which TensorRT-LLM's clients send for none, are dropped), each list as ``(word, weight)``."""
    ids = [_as_int("logit_bias_ids", v) for v in _values(get, "logit_bias_ids") or ()]
    values = [_as_float("logit_bias_values", v) for v in _values(get, "logit_bias_values") or ()]
    if len(ids) != len(values):
        raise InvalidRequestError(f"logit_bias_ids holds {len(ids)} ids and logit_bias_values {len(values)} values; "
                                  "send one value per id")
    if len(ids) > MAX_LOGIT_BIAS:
        raise InvalidRequestError(f"at most {MAX_LOGIT_BIAS} logit_bias_ids, got {len(ids)}")
    if any(t < 0 for t in ids):
        raise InvalidRequestError(f"logit_bias_ids must be token ids (>= 0), got {_short(min(ids))}")
    words = _texts(get, "embedding_bias_words")
    weights = [_as_float("embedding_bias_weights", v) for v in _values(get, "embedding_bias_weights") or ()]
    if len(words) != len(weights) and (weights or any(words)):
        raise InvalidRequestError(f"embedding_bias_words holds {len(words)} words and embedding_bias_weights "
                                  f"{len(weights)} weights; send one weight per word")
    pairs = tuple((w, x) for w, x in zip(words, weights) if w)
    _check_words(tuple(w for w, _ in pairs), "embedding_bias_words")
    return LogitBias.of(zip(ids, values)), pairs


def _draft_tokens(get: Lookup, speculation: Speculation) -> tuple[Speculation, int | None]:
    """``num_draft_tokens``: the most tokens a draft may hold (0: TensorRT-LLM's no speculation)."""
    max_draft = _int(get, "num_draft_tokens")
    if max_draft is not None and max_draft < 0:
        raise InvalidRequestError(f"num_draft_tokens must be >= 0, got {_short(max_draft)}")
    if max_draft == 0:  # TensorRT-LLM: no draft tokens, no speculation
        if speculation is Speculation.ON:
            raise InvalidRequestError("num_draft_tokens 0 contradicts speculation 'on'")
        speculation = Speculation.OFF
    return speculation, max_draft


# TensorRT-LLM inputs trtspec cannot honour: name -> the values that mean "not used" (any
# other is refused); () for inputs refused whenever they hold anything.
_NEUTRAL_ONLY: dict[str, tuple] = {
    "beam_width": (1,),
    "num_return_sequences": (1,),
    "return_context_logits": (False,),
    "return_generation_logits": (False,),
    "decoder_text_input": ("", b""),
    "image_url_input": ("", b""),
    "guided_decoding_guide_type": ("", b""),
    "guided_decoding_guide": ("", b""),
    "image_input": (),
    "image_bytes_input": (),
    "image_sizes_input": (),
    "video_bytes_input": (),
    "prompt_embedding_table": (),
    "prompt_vocab_size": (),
    "prompt_table_extra_id": (),
    "lora_task_id": (),
    "lora_weights": (),
    "lora_config": (),
}
_WHY = {
    "beam_width": "trtspec decodes one beam",
    "num_return_sequences": "trtspec returns one sequence per request",
    "decoder_text_input": "trtspec serves decoder-only models",
    "image_url_input": "trtspec serves text-only models",
    "image_input": "trtspec serves text-only models",
    "image_bytes_input": "trtspec serves text-only models",
    "image_sizes_input": "trtspec serves text-only models",
    "video_bytes_input": "trtspec serves text-only models",
    "prompt_embedding_table": "trtspec does no prompt tuning",
    "prompt_vocab_size": "trtspec does no prompt tuning",
    "prompt_table_extra_id": "trtspec does no prompt tuning",
    "lora_task_id": "trtspec serves no LoRA adapters",
    "lora_weights": "trtspec serves no LoRA adapters",
    "lora_config": "trtspec serves no LoRA adapters",
}


_NOTHING = object()


def refuse_unsupported(get: Lookup) -> None:
    """INVALID_ARG for a TensorRT-LLM input set to something trtspec cannot do, naming the value."""
    for name in _NEUTRAL_ONLY:
        why = refusal(name, _values(get, name) or ())
        if why is not None:
            raise InvalidRequestError(why)


def refusal(name: str, values: Sequence) -> str | None:
    """Why ``name`` (an input of :data:`_NEUTRAL_ONLY`) holding ``values`` is refused, in one line
    naming the value; None when every value is a neutral one."""
    neutral = _NEUTRAL_ONLY[name]
    bad = next((v for v in values if v not in neutral), _NOTHING)
    if bad is _NOTHING:
        return None
    shown = _short(bad.decode("utf-8", "replace") if isinstance(bad, bytes) else bad)
    why = _WHY.get(name, f"trtspec does not support {name}")
    allowed = f" (only {', '.join(repr(v) for v in neutral if not isinstance(v, bytes))})" if neutral else ""
    return f"{name} {shown}: {why}{allowed}"


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


def _choice(get: Lookup, name: str, kind: type[E], default: E) -> E:
    """One of the enum's values, case and surrounding blanks ignored; not given or empty: ``default``."""
    text = _text(get, name)
    if not text:
        return default
    try:
        return kind(text.strip().lower())
    except ValueError:
        choices = ", ".join(str(v.value) for v in kind)
        raise InvalidRequestError(f"{name} must be one of {choices}; got {_short(text)}") from None


def _int(get: Lookup, name: str, required: bool = False) -> int | None:
    v = _scalar(get, name, required)
    return None if v is None else _as_int(name, v)


def _as_int(name: str, v: Any) -> int:
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
        if isinstance(v, (float, np.floating)) and float(v).is_integer():
            return int(v)  # a JSON parameter like 16.0
        raise InvalidRequestError(f"input '{name}' must be an integer, got {_short(v)}")
    return int(v)


def _float(get: Lookup, name: str) -> float | None:
    v = _scalar(get, name, False)
    return None if v is None else _as_float(name, v)


def _as_float(name: str, v: Any) -> float:
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
