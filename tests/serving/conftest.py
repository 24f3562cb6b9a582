"""Fixtures of the serving tests: the in-process reference (the target alone).
The tiny model repository and the shared tritonserver are in tests/conftest.py."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from trtspec.spec import FixedDraftLength, GenerationRequest, GenerationResult, StopCriteria



@pytest.fixture(scope="session")
def target_alone(tiny_target: Path):
    from trtspec.runtime.pair import load_pair

    return load_pair(tiny_target, None)


Reference = Callable[..., GenerationResult]


@pytest.fixture(scope="session")
def reference(target_alone) -> Reference:
    """What the target alone generates in-process for a prompt, tokenized as spec_decode does."""
    tok = target_alone.target.tokenizer

    def run(text: str, max_tokens: int, stop_words: Sequence[str] = ()) -> GenerationResult:
        request = GenerationRequest(
            prompt_ids=tuple(tok.encode_prompt(text)),
            stop=StopCriteria(max_new_tokens=max_tokens, eos_token_ids=tok.eos_token_ids(), stop_strings=tuple(stop_words)),
        )
        return target_alone.decoder().generate(request, FixedDraftLength(0))

    return run
