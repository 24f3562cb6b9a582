"""Shared fixtures: tiny checkpoints (seconds) and the demo pair (cached, minutes once)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from trtspec.testing.tiny import make_tiny_llama

torch.set_num_threads(max(1, min(2, torch.get_num_threads())))


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
