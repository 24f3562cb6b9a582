"""Shared fixtures: tiny checkpoints (seconds) and the demo pair (cached, minutes once)."""

from __future__ import annotations

import os
from pathlib import Path

# Before torch loads OpenMP: idle OpenMP threads sleep instead of spinning. On a
# shared 2-core machine (the tests start tritonservers beside themselves) spinning
# threads make small matmuls up to 100x slower.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import pytest  # noqa: E402
import torch  # noqa: E402

from trtspec.testing.tiny import make_tiny_llama  # noqa: E402

# One intra-op thread: the tiny models gain nothing from two, and the demo pair's
# tests check outputs, not speed (benchmarks measure speed).
torch.set_num_threads(1)


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("tiny")


@pytest.fixture(scope="session")
def tiny_target(tiny_dir: Path) -> Path:
    return make_tiny_llama(tiny_dir / "target", seed=0)


@pytest.fixture(scope="session")
def tiny_draft(tiny_dir: Path, tiny_target: Path) -> Path:
    """A draft that mostly agrees with the target (its weights plus 1% noise)."""
    return make_tiny_llama(tiny_dir / "draft", seed=1, base=tiny_target, noise=0.01)


@pytest.fixture(scope="session")
def tiny_bad_draft(tiny_dir: Path) -> Path:
    """An unrelated random model with the same tokenizer: acceptance near zero."""
    return make_tiny_llama(tiny_dir / "bad_draft", seed=7)


@pytest.fixture(scope="session")
def tiny_pair(tiny_target: Path, tiny_draft: Path):
    from trtspec.runtime.pair import load_pair

    return load_pair(tiny_target, tiny_draft)


@pytest.fixture(scope="session")
def demo_pair_paths():
    """The real demo pair (SmolLM2-135M-Instruct + INT8 copy), prepared once into ~/.cache/trtspec."""
    from trtspec.runtime.demo import prepare_demo

    return prepare_demo()


@pytest.fixture(scope="session")
def demo_pair(demo_pair_paths):
    from trtspec.runtime.pair import load_pair

    return load_pair(demo_pair_paths.target, demo_pair_paths.draft)
