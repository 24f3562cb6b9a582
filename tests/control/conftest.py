"""Fixtures of the control-plane tests: a fake clock and a writer of policy files."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from trtspec.control import FakeClock


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(start=1000.0)


@pytest.fixture
def policy_file(tmp_path: Path) -> Callable[[str, str], Path]:
    """Write ``text`` to a file named ``name`` and return its path."""

    def write(text: str, name: str = "policy.yaml") -> Path:
        p = tmp_path / name
        p.write_text(text)
        return p

    return write
