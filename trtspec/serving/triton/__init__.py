"""The Triton Python-backend models: ``spec_decode`` (orchestrator), and ``draft``/``target`` (torch runtime).

Each generated ``model.py`` is one import line pointing at a ``TritonPythonModel``
class here. ``triton_python_backend_utils`` exists only inside Triton's Python
stub, so the classes import it lazily and accept a stand-in
(:mod:`trtspec.testing.fake_triton`) for tests outside the server.
"""

from __future__ import annotations

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


def error_code(pb: Any, name: str) -> Any:
    """``pb.TritonError.<name>`` (INVALID_ARG, UNAVAILABLE, CANCELLED, INTERNAL, ...)."""
    return getattr(pb.TritonError, name)


__all__ = ["error_code", "load_pb_utils", "model_parameters"]
