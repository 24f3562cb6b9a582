"""A real tritonserver on the tiny models for the bench tests.

The same as tests/serving/conftest.py's ``triton`` fixture (a session fixture
there is not visible from this package); loopback only, free ports.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from trtspec.build.repo import write_model_repo
from trtspec.serving.launcher import ServerError, TritonServer, find_tritonserver

MAX_TOKENS_LIMIT = 200  # the tiny models hold 256 tokens


@pytest.fixture(scope="session")
def bench_server(tmp_path_factory: pytest.TempPathFactory, tiny_target: Path, tiny_draft: Path) -> Iterator[TritonServer]:
    try:
        install = find_tritonserver()
    except ServerError as e:
        pytest.skip(str(e))
    repo = write_model_repo(
        tmp_path_factory.mktemp("bench_repo") / "model_repo",
        target_checkpoint=tiny_target,
        draft_checkpoint=tiny_draft,
        max_tokens_limit=MAX_TOKENS_LIMIT,
        max_concurrency=8,
        max_sessions=64,
    )
    server = TritonServer(repo, log_file=tmp_path_factory.mktemp("bench_triton") / "tritonserver.log", install=install)
    server.start()
    try:
        yield server
    finally:
        server.stop()
