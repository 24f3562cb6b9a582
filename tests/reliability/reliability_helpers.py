"""Helpers of the reliability tests: servers of their own (tests that kill stubs or inject
faults must not touch the shared ``triton``), polling, status and metric readers."""

from __future__ import annotations

import re
import time
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from trtspec.builder.repo import write_model_repo
from trtspec.serving import statusfile
from trtspec.serving.launcher import ServerError, TritonServer, find_tritonserver
from trtspec.testing.tiny import STATIC_POLICY, pair_paths  # noqa: F401 (STATIC_POLICY: for the tests here)

MAX_TOKENS_LIMIT = 200  # as tiny_repo in tests/conftest.py

PROMPTS = (
    "The quick brown fox",
    "Speculative decoding drafts tokens",
    "Triton Inference Server serves models",
    "Hello world! How are you",
    "Numbers 0 1 2 3",
    "def f(x): return",
)


@contextmanager
def own_server(
    root: Path,
    target: Path,
    draft: Path,
    *,
    policy: str,
    spec_decode: Mapping[str, Any] | None = None,
    draft_params: Mapping[str, Any] | None = None,
) -> Iterator[TritonServer]:
    """A tritonserver of the test's own on a tiny repository with these parameters; stopped afterwards."""
    try:
        install = find_tritonserver()
    except ServerError as e:
        pytest.skip(str(e))
    policy_file = root / "policy.yaml"
    policy_file.write_text(policy)
    repo = write_model_repo(
        root / "model_repo", target_checkpoint=target, draft_checkpoint=draft, max_tokens_limit=MAX_TOKENS_LIMIT,
        max_concurrency=8, policy_file=policy_file, spec_decode_parameters=spec_decode, draft_parameters=draft_params,
    )
    server = TritonServer(repo, log_file=root / "tritonserver.log", install=install)
    server.start()
    try:
        yield server
    finally:
        server.stop()


def wait_for(predicate: Callable[[], Any], timeout_s: float, what: str, interval_s: float = 0.1) -> Any:
    """Poll ``predicate`` until it returns something truthy (returned); fail after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout_s:.0f}s waiting for {what}")
        time.sleep(interval_s)  # polling interval, not synchronisation


def control(server: TritonServer) -> dict:
    """spec_decode's status file (supervisor states, breaker, speculation); {} before the first write."""
    assert server.status_dir is not None
    return statusfile.read_status(server.status_dir / "spec_decode.json") or {}


def model_status(server: TritonServer, model: str) -> dict:
    assert server.status_dir is not None
    return statusfile.read_status(server.status_dir / f"{model}.json") or {}


def metric(server: TritonServer, name: str, **labels: str) -> float:
    """Sum of the samples of ``name`` whose labels include ``labels`` (0 if absent)."""
    text = urllib.request.urlopen(server.endpoints.metrics_url, timeout=10).read().decode()
    total = 0.0
    for line in text.splitlines():
        m = re.match(rf"^{name}\{{(.*)\}} (\S+)$", line)
        if m and all(f'{k}="{v}"' in m.group(1) for k, v in labels.items()):
            total += float(m.group(2))
    return total


def long_context_pair(root: Path) -> tuple[Path, Path]:
    """A tiny target and draft that hold 4,096 tokens (``tiny-long``): a ~3,300-token prompt takes them
    1-3 s to prefill on 2 cores (the usual tiny models hold 256 and prefill in milliseconds)."""
    return pair_paths("tiny-long", root)


LONG_PROMPT = "word " * 1100  # ~3,300 tokens with the tiny tokenizer
