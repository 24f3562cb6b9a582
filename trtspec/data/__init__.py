"""Data shipped with trtspec (benchmark prompts)."""

from __future__ import annotations

import json
from importlib import resources


def benchmark_prompts() -> list[str]:
    """The fixed prompt set used by the benchmarks (24 chat-style instructions)."""
    text = resources.files("trtspec.data").joinpath("prompts.json").read_text()
    return list(json.loads(text)["prompts"])
