"""Fixtures of the serving tests: the tiny model repository, one real tritonserver
shared by the end-to-end tests, and the in-process reference (the target alone)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest

from trtspec.build.repo import write_model_repo
from trtspec.serving.launcher import ServerError, TritonServer, find_tritonserver
from trtspec.spec import FixedDraftLength, GenerationRequest, GenerationResult, StopCriteria

MAX_TOKENS_LIMIT = 200  # the tiny models hold 256 tokens


@pytest.fixture(scope="session")
def tiny_repo(tmp_path_factory: pytest.TempPathFactory, tiny_target: Path, tiny_draft: Path) -> Path:
    return write_model_repo(
        tmp_path_factory.mktemp("repo") / "model_repo",
        target_checkpoint=tiny_target,
        draft_checkpoint=tiny_draft,
        max_tokens_limit=MAX_TOKENS_LIMIT,
        max_concurrency=8,
        max_sessions=32,
    )


@pytest.fixture(scope="session")
def triton(tiny_repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TritonServer]:
    """A real tritonserver on the tiny repository, loopback only, free ports."""
    try:
        install = find_tritonserver()
    except ServerError as e:
        pytest.skip(str(e))
    server = TritonServer(tiny_repo, log_file=tmp_path_factory.mktemp("triton") / "tritonserver.log", install=install)
    server.start()
    try:
        yield server
    finally:
        server.stop()


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
