"""The bench tests run against the shared tiny-model tritonserver (``triton`` in tests/conftest.py)."""

from __future__ import annotations

import pytest

from trtspec.serving.launcher import TritonServer


@pytest.fixture(scope="session")
def bench_server(triton: TritonServer) -> TritonServer:
    return triton
