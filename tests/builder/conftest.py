"""A torch-backend build of the tiny pair, made once for the build tests that only read it."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from trtspec.builder.pipeline import BuildOptions, BuildResult, run_build
from trtspec.builder.quantize import ProbeSettings

FAST_PROBE = ProbeSettings(num_prompts=2, max_new_tokens=12)


def _options(target: Path, draft: Path | None, root: Path, **overrides) -> BuildOptions:
    base = dict(
        target=target,
        draft=draft,
        name="tiny",
        engines_dir=root / "engines",
        model_repo=root / "model_repo",
        probe=FAST_PROBE,
        max_sessions=4,
        draft_quant="int8",  # the tests' figures are int8's; auto depends on the CPU (test_auto_draft_quant_*)
    )
    base.update(overrides)
    return BuildOptions(**base)


@pytest.fixture(scope="session")
def tiny_options(tiny_target: Path, tiny_draft: Path) -> Callable[..., BuildOptions]:
    """``tiny_options(root, **overrides)``: build options for the tiny pair, writing under ``root``
    (``draft=None``: the tiny target alone)."""
    return lambda root, **overrides: _options(
        overrides.pop("target", tiny_target), overrides.pop("draft", tiny_draft), root, **overrides
    )


@pytest.fixture(scope="session")
def tiny_build(tiny_target: Path, tiny_draft: Path, tmp_path_factory: pytest.TempPathFactory) -> BuildResult:
    """Read-only: tests that rebuild or tamper make their own."""
    root = tmp_path_factory.mktemp("tiny_build")
    return run_build(_options(tiny_target, tiny_draft, root))


@pytest.fixture(scope="session")
def tiny_target_build(tiny_target: Path, tmp_path_factory: pytest.TempPathFactory) -> BuildResult:
    """Read-only: the tiny target built without a draft model."""
    root = tmp_path_factory.mktemp("tiny_target_build")
    return run_build(_options(tiny_target, None, root))
