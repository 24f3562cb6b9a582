"""Errors of the build layer; each carries a one-line, human message."""

from __future__ import annotations

from trtspec.errors import TrtspecError


class BuildError(TrtspecError):
    """A build step cannot go on (bad option, unreadable input, failed tool)."""


class MemoryPlanError(BuildError):
    """Draft and target (weights and KV caches) do not fit in the device's memory."""


class TrtllmUnavailableError(BuildError):
    """The TensorRT-LLM path needs ``tensorrt_llm`` and an NVIDIA GPU, and this host lacks one."""


class ManifestError(TrtspecError):
    """An engine manifest is missing or unreadable."""


class ManifestMismatchError(ManifestError):
    """The engines were built for something other than what this server runs."""
