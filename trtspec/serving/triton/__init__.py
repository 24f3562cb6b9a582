"""The Triton Python-backend models: ``spec_decode`` (orchestrator), and ``draft``/``target`` (torch runtime).

Each generated ``model.py`` is one import line pointing at a ``TritonPythonModel``
class here. ``triton_python_backend_utils`` exists only inside Triton's Python
stub, so the classes import it lazily and accept a stand-in
(:mod:`trtspec.testing.fake_triton`) for tests outside the server.
"""

from __future__ import annotations

import math
from typing import Any


def load_pb_utils(pb: Any = None) -> Any:
    """``pb`` if given (a test double), else the real ``triton_python_backend_utils``."""
    if pb is not None:
        return pb
    import triton_python_backend_utils  # only importable inside Triton's Python stub

    return triton_python_backend_utils


def model_parameters(model_config: dict) -> dict[str, str]:
    """The ``parameters { key: ..., value: { string_value: ... } }`` of a model config, as a plain dict."""
    params = model_config.get("parameters") or {}
    return {k: str(v.get("string_value", "")) for k, v in params.items()}


def param_str(params: dict[str, str], key: str, default: str = "") -> str:
    v = params.get(key, "")
    return v if v != "" else default


def param_int(params: dict[str, str], key: str, default: int) -> int:
    v = params.get(key, "")
    if v == "":
        return default
    try:
        return int(v)
    except ValueError:
        raise ValueError(f"model parameter {key!r} must be an integer, got {v!r}") from None


def param_float(params: dict[str, str], key: str, default: float) -> float:
    v = params.get(key, "")
    if v == "":
        return default
    try:
        f = float(v)
    except ValueError:
        raise ValueError(f"model parameter {key!r} must be a number, got {v!r}") from None
    if not math.isfinite(f):
        raise ValueError(f"model parameter {key!r} must be finite, got {v!r}")
    return f


def check_parameter_keys(model: str, params: dict[str, str], allowed: tuple[str, ...]) -> None:
    """Refuse parameter keys the model does not know (a typo must not be silently ignored)."""
    unknown = sorted(set(params) - set(allowed))
    if unknown:
        raise ValueError(
            f"model '{model}': unknown parameter(s) {', '.join(unknown)}; allowed: {', '.join(allowed)}"
        )


def param_bool(params: dict[str, str], key: str, default: bool) -> bool:
    v = params.get(key, "").strip().lower()
    if v == "":
        return default
    if v in ("1", "true", "yes", "on"):
        return True
    if v in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"model parameter {key!r} must be true or false, got {v!r}")


def error_code(pb: Any, name: str) -> Any:
    """``pb.TritonError.<name>`` (INVALID_ARG, UNAVAILABLE, CANCELLED, INTERNAL, ...)."""
    return getattr(pb.TritonError, name)


__all__ = [
    "check_parameter_keys",
    "error_code",
    "load_pb_utils",
    "model_parameters",
    "param_bool",
    "param_float",
    "param_int",
    "param_str",
]
