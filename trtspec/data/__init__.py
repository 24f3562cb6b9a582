"""Data shipped with trtspec (benchmark prompts)."""

from __future__ import annotations

import json
from importlib import resources


def benchmark_prompts() -> list[str]:
    """The fixed prompt set used by the benchmarks (24 chat-style instructions)."""
    return _prompts("prompts.json")


def copy_edit_prompts() -> list[str]:
    """24 copy/edit prompts (repeat or fix a given paragraph or function): answers that repeat their input."""
    return _prompts("copy_edit_prompts.json")


def _prompts(name: str) -> list[str]:
    text = resources.files("trtspec.data").joinpath(name).read_text()
    return list(json.loads(text)["prompts"])
