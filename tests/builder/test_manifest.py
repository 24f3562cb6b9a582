"""manifest.json: reading it, and refusing engines that do not match what the server runs."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest

from trtspec.builder.errors import ManifestError, ManifestMismatchError
from trtspec.builder.manifest import (
    Manifest,
    RuntimeVersions,
    check_manifest,
    load_manifest,
    major_minor,
    verify_engines,
)
from trtspec.builder.pipeline import BuildResult


@pytest.fixture()
def engines(tiny_build: BuildResult, tmp_path: Path) -> Path:
    """A private copy of the tiny build's engine directory (tests tamper with it)."""
    dst = tmp_path / "tiny"
    shutil.copytree(tiny_build.engine_dir, dst)
    return dst


def test_manifest_records_the_build(tiny_build: BuildResult) -> None:
    m = load_manifest(tiny_build.manifest_path)
    assert m == tiny_build.manifest
    assert m.backend == "torch" and m.name == "tiny" and m.schema_version == 1
    assert m.versions.trtspec and m.versions.torch and m.versions.transformers and m.versions.tensorrt_llm is None
    assert m.max_draft_len == 5 and m.vocab_size == 384 and len(m.tokenizer_fingerprint) == 16
    assert m.quantization.draft["method"] == "int8_weight_only"
    assert m.models["draft"].precision == "int8" and m.models["target"].precision == "fp32"
    paths = {f.path for f in m.files}
    assert {"target/model.safetensors", "draft/model.safetensors", "draft/config.json", "target/tokenizer.json"} <= paths
    assert all(len(f.sha256) == 64 and f.bytes > 0 for f in m.files)
    assert m.build_options["draft_quant"] == "int8" and m.build_options["max_sessions"] == 4


def test_the_server_accepts_its_own_build(engines: Path) -> None:
    m = verify_engines(engines, "torch")
    assert m.name == "tiny"


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(backend="trtllm"), "built for the torch backend, this server runs trtllm"),
        (dict(trtspec="0.99.0"), r"built with trtspec [\d.]+, this server runs 0.99.0"),
        (dict(torch="1.13.1"), r"built with torch \d+\.\d+, this server runs torch 1.13"),
    ],
)
def test_mismatched_versions_are_refused(tiny_build: BuildResult, change: dict, message: str) -> None:
    runtime = dataclasses.replace(RuntimeVersions.current("torch"), **change)
    with pytest.raises(ManifestMismatchError, match=message):
        check_manifest(tiny_build.manifest, runtime)


def test_patch_versions_do_not_matter(tiny_build: BuildResult) -> None:
    here = RuntimeVersions.current("torch")
    mm = major_minor(here.torch)
    assert mm is not None
    runtime = dataclasses.replace(here, torch=f"{mm[0]}.{mm[1]}.99", trtspec=here.trtspec + ".post1")
    check_manifest(tiny_build.manifest, runtime)


def test_trtllm_engines_are_tied_to_version_and_gpu(tiny_build: BuildResult) -> None:
    built = tiny_build.manifest.model_copy(
        update={
            "backend": "trtllm",
            "versions": tiny_build.manifest.versions.model_copy(update={"tensorrt_llm": "1.2.0"}),
            "gpu": {"name": "NVIDIA H100", "compute_capability": "9.0"},
        }
    )
    ok = RuntimeVersions("trtllm", tiny_build.manifest.versions.trtspec, None, "1.2.0", "9.0")
    check_manifest(built, ok)
    with pytest.raises(ManifestMismatchError, match="TensorRT-LLM 1.2.0, this server runs 1.2.1"):
        check_manifest(built, dataclasses.replace(ok, tensorrt_llm="1.2.1"))
    with pytest.raises(ManifestMismatchError, match="compute capability 9.0, this GPU is 8.0"):
        check_manifest(built, dataclasses.replace(ok, gpu_compute_capability="8.0"))
    with pytest.raises(ManifestMismatchError, match="no TensorRT-LLM"):
        check_manifest(built, dataclasses.replace(ok, tensorrt_llm=None))


def test_changed_or_missing_files_are_refused(engines: Path) -> None:
    weights = engines / "draft" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF  # same size, different content
    weights.write_bytes(bytes(data))
    with pytest.raises(ManifestMismatchError, match=r"draft/model.safetensors changed since the build.*trtspec build"):
        verify_engines(engines, "torch")
    verify_engines(engines, "torch", verify_hashes=False)  # sizes alone still match
    (engines / "target" / "tokenizer.json").unlink()
    with pytest.raises(ManifestMismatchError, match="target/tokenizer.json is missing"):
        verify_engines(engines, "torch", verify_hashes=False)


def test_unreadable_manifests(engines: Path, tmp_path: Path) -> None:
    with pytest.raises(ManifestError, match="no engine manifest"):
        load_manifest(tmp_path / "nowhere")
    path = engines / "manifest.json"
    data = json.loads(path.read_text())
    path.write_text("{not json")
    with pytest.raises(ManifestError, match="cannot read engine manifest"):
        load_manifest(path)
    path.write_text(json.dumps({**data, "schema_version": 2}))
    with pytest.raises(ManifestError, match="schema 2; this trtspec reads schema 1"):
        load_manifest(path)
    broken = dict(data)
    del broken["vocab_size"]
    path.write_text(json.dumps(broken))
    with pytest.raises(ManifestError, match="malformed: vocab_size"):
        load_manifest(engines)


def test_round_trip_is_stable(tiny_build: BuildResult, tmp_path: Path) -> None:
    m: Manifest = tiny_build.manifest
    m.write(tmp_path / "m.json")
    assert (tmp_path / "m.json").read_text() == tiny_build.manifest_path.read_text()
    assert load_manifest(tmp_path / "m.json").same_build(m.model_copy(update={"created": "1970-01-01T00:00:00+00:00"}))


def _spec_decode_config(engines: Path, check: str) -> dict:
    from trtspec.builder.repo import checkpoint_facts, spec_decode_config

    _, vocab, ctx = checkpoint_facts(engines / "target", None)
    return spec_decode_config(tokenizer_dir=str(engines / "target"), vocab_size=vocab, target_max_context=ctx,
                              draft_max_context=ctx, warmup=False, manifest_file=str(engines / "manifest.json"),
                              parameters={"manifest_check": check, "supervise": False})


def test_spec_decode_refuses_at_load_engines_changed_since_the_build(engines: Path) -> None:
    from trtspec.serving.triton.spec_decode import TritonPythonModel
    from trtspec.testing.fake_triton import FakeTriton

    def load(check: str) -> None:
        fake = FakeTriton()
        fake.add_model("spec_decode", TritonPythonModel(fake), _spec_decode_config(engines, check))
        fake.finalize()

    load("full")  # its own build: accepted
    weights = engines / "draft" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF  # same size, other bytes
    weights.write_bytes(bytes(data))
    with pytest.raises(ManifestMismatchError, match=r"^engines 'tiny' do not match this server: "
                                                    r"draft/model.safetensors changed since the build"):
        load("full")
    load("quick")  # sizes only: they still match
    load("off")
    with pytest.raises(ValueError, match="manifest_check must be one of full, quick, off, got 'sometimes'"):
        load("sometimes")


def test_a_server_on_engines_that_do_not_match_fails_to_start_saying_why(engines: Path, tmp_path: Path) -> None:
    from trtspec.builder.repo import write_model_repo
    from trtspec.serving.launcher import ServerError, TritonServer, find_tritonserver

    try:
        install = find_tritonserver()
    except ServerError as e:
        pytest.skip(str(e))
    manifest = json.loads((engines / "manifest.json").read_text())
    manifest["versions"]["trtspec"] = "0.0.1"  # as if built by another trtspec
    (engines / "manifest.json").write_text(json.dumps(manifest))
    repo = write_model_repo(tmp_path / "repo", target_checkpoint=engines / "target", draft_checkpoint=engines / "draft",
                            manifest_file=engines / "manifest.json", max_sessions=4)
    server = TritonServer(repo, log_file=tmp_path / "tritonserver.log", install=install, startup_timeout_s=120)
    with pytest.raises(ServerError, match=r"do not match this server: built with trtspec 0.0.1"):
        server.start()
    server.stop()


def test_the_gpu_compute_capability_is_read_through_nvml_without_starting_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    """The NVML boundary stood in for (no GPU here): spec_decode's check must not create a CUDA
    context in its own process (memory the engines were planned to have)."""
    import sys
    import types

    import torch

    from trtspec.builder.manifest import _cuda_compute_capability

    calls: list = []
    nvml = types.SimpleNamespace(
        nvmlInit=lambda: calls.append("init"),
        nvmlShutdown=lambda: calls.append("shutdown"),
        nvmlDeviceGetHandleByIndex=lambda i: calls.append(("handle", i)) or f"gpu{i}",
        nvmlDeviceGetCudaComputeCapability=lambda h: (9, 0),
    )
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,1")
    assert _cuda_compute_capability() == "9.0"
    assert calls == ["init", ("handle", 3), "shutdown"]
    assert not torch.cuda.is_initialized()

    def no_gpu():
        raise RuntimeError("NVML Shared Library Not Found")

    monkeypatch.setitem(sys.modules, "pynvml", types.SimpleNamespace(nvmlInit=no_gpu))
    assert _cuda_compute_capability() is None  # unknown: the check is skipped, not failed
