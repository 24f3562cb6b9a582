"""scripts/ci_build_engines.sh and scripts/mps.sh, as far as a GPU-less host can run them."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"
CI = SCRIPTS / "ci_build_engines.sh"
MPS = SCRIPTS / "mps.sh"


def run(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", *args], capture_output=True, text=True, env=env, timeout=300)


@pytest.mark.parametrize("script", [CI, MPS])
def test_scripts_parse(script: Path) -> None:
    assert run("-n", str(script)).returncode == 0


def test_mps_checks_its_arguments() -> None:
    bad = run(str(MPS), "run", "150", "--", "true")
    assert bad.returncode == 1 and "percentage must be an integer in 1..100" in bad.stderr
    usage = run(str(MPS), "run", "30", "true")
    assert usage.returncode == 1 and "usage: mps.sh run PCT -- CMD" in usage.stderr
    unknown = run(str(MPS), "frobnicate")
    assert unknown.returncode == 2 and "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" in unknown.stdout


@pytest.mark.skipif(shutil.which("nvidia-cuda-mps-control") is not None, reason="MPS is installed here")
def test_mps_says_what_is_missing() -> None:
    res = run(str(MPS), "start")
    assert res.returncode == 1 and "nvidia-cuda-mps-control not found" in res.stderr


def test_ci_job_builds_checks_and_packs(tiny_target: Path, tiny_draft: Path, tmp_path: Path) -> None:
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", "BACKEND": "torch",
           "TARGET": str(tiny_target), "DRAFT": str(tiny_draft), "NAME": "tiny", "OUT": str(tmp_path / "out"),
           "MAX_SESSIONS": "2", "MIN_ACCEPTANCE": "0"}
    res = run(str(CI), env=env)
    assert res.returncode == 0, res.stderr
    assert "manifest verified against this machine" in res.stdout
    result = json.loads((tmp_path / "out" / "build.json").read_text())
    assert result["name"] == "tiny" and result["memory_plan"]["sessions"] == 2
    with tarfile.open(tmp_path / "out" / "tiny-engines.tar.gz") as tar:
        names = tar.getnames()
    assert "engines/tiny/manifest.json" in names and "model_repo/spec_decode/config.pbtxt" in names
    # A floor above what the draft reaches fails the job.
    strict = run(str(CI), env={**env, "MIN_ACCEPTANCE": "1.01"})
    assert strict.returncode != 0 and "below MIN_ACCEPTANCE" in strict.stderr


def test_ci_job_builds_a_target_without_a_draft(tiny_target: Path, tmp_path: Path) -> None:
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", "BACKEND": "torch",
           "TARGET": str(tiny_target), "NAME": "tiny", "OUT": str(tmp_path / "out"), "MAX_SESSIONS": "2",
           "DEFAULT_DRAFTER": "suffix"}
    env.pop("DRAFT", None)
    res = run(str(CI), env=env)
    assert res.returncode == 0, res.stderr
    assert "no draft model; default drafter suffix" in res.stdout and "manifest verified" in res.stdout
    assert "    target: " in res.stdout and "    draft: " not in res.stdout
