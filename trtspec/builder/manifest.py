"""``engines/<name>/manifest.json``: what was built, from what, with what.

The server reads it before loading a model and refuses engines that do not
match what it runs (:func:`check_manifest`, :func:`verify_engines`): another
backend, another trtspec major.minor, another torch major.minor (the torch
runtime's int8 kernels come from torch), another TensorRT-LLM version or GPU
architecture (engines are not portable across either), or files that changed
since the build. This is the start of the cross-version compatibility check;
what a mismatch allows may loosen later, never silently.
"""

from __future__ import annotations

import json
import platform
import re
from collections.abc import Iterable
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, ValidationError

import trtspec
from trtspec.builder.errors import ManifestError, ManifestMismatchError
from trtspec.builder.memory import env_device_index
from trtspec.paths import sha256_file

SCHEMA_VERSION = 1
MANIFEST_FILE = "manifest.json"
Backend = Literal["torch", "trtllm"]


def package_version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


class FileEntry(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    path: str  # relative to the engine directory, POSIX separators
    bytes: int
    sha256: str


class Versions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    trtspec: str
    python: str
    torch: str | None = None
    transformers: str | None = None
    tensorrt_llm: str | None = None

    @classmethod
    def current(cls) -> Versions:
        return cls(
            trtspec=trtspec.__version__,
            python=platform.python_version(),
            torch=package_version("torch"),
            transformers=package_version("transformers"),
            tensorrt_llm=package_version("tensorrt_llm") or package_version("tensorrt-llm"),
        )


class ModelEntry(BaseModel):
    model_config = ConfigDict(extra="forbid")

    role: Literal["target", "draft"]
    source: str  # the checkpoint given to the build
    source_sha256: str  # over the source's files (names and contents)
    path: str  # its artefacts, relative to the engine directory
    architecture: str
    precision: str  # what the server runs it at: fp32 | bf16 | int8 | int4 (torch); bfloat16 | w8a16 (trtllm)
    weight_bytes: int  # as the runtime holds them
    kv_bytes_per_token: int
    max_context: int


class Quantization(BaseModel):
    model_config = ConfigDict(extra="forbid")

    draft: dict | None  # the scheme (method, granularity, symmetric, ...) or {"method": "none"}; None: no draft model
    report: dict | None = None  # weight bytes and acceptance before/after (QuantReport.to_dict())


class Manifest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    schema_version: int = SCHEMA_VERSION
    name: str
    backend: Backend
    created: str  # ISO 8601, UTC; kept across rebuilds of the same inputs
    versions: Versions
    gpu: dict | None = None  # trtllm: {"name", "compute_capability"} of the build GPU
    inputs_sha256: str  # sources + engine-shaping options + versions: equal means "nothing to rebuild"
    build_options: dict
    max_draft_len: int
    vocab_size: int
    tokenizer_fingerprint: str
    quantization: Quantization
    models: dict[str, ModelEntry]
    memory_plan: dict
    files: list[FileEntry]

    def to_json(self) -> str:
        return json.dumps(self.model_dump(mode="json"), indent=2, sort_keys=True) + "\n"

    def write(self, path: Path) -> None:
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(self.to_json())
        tmp.replace(path)

    def same_build(self, other: Manifest) -> bool:
        """Equal in everything but the creation time."""
        return self.model_dump(exclude={"created"}) == other.model_dump(exclude={"created"})


def load_manifest(path: Path) -> Manifest:
    """Read a manifest; :class:`ManifestError` with one line when missing or malformed."""
    if path.is_dir():
        path = path / MANIFEST_FILE
    if not path.is_file():
        raise ManifestError(f"no engine manifest at {path}; build the engines with `trtspec build`")
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ManifestError(f"cannot read engine manifest {path}: {e}") from e
    if isinstance(data, dict) and data.get("schema_version", SCHEMA_VERSION) != SCHEMA_VERSION:
        raise ManifestError(
            f"{path} has manifest schema {data.get('schema_version')}; this trtspec reads schema {SCHEMA_VERSION}: "
            f"rebuild with `trtspec build`"
        )
    try:
        return Manifest.model_validate(data)
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise ManifestError(f"engine manifest {path} is malformed: {where}: {first['msg']}") from e


def hash_files(root: Path, paths: Iterable[Path]) -> list[FileEntry]:
    """Entries for ``paths`` (files under ``root``), sorted by relative path."""
    entries = [
        FileEntry(path=p.relative_to(root).as_posix(), bytes=p.stat().st_size, sha256=sha256_file(p)) for p in paths
    ]
    return sorted(entries, key=lambda e: e.path)


def file_problems(root: Path, files: Iterable[FileEntry], verify_hashes: bool = True) -> list[str]:
    """What differs between the files recorded and those on disk (empty when all match)."""
    problems = []
    for f in files:
        p = root / f.path
        if not p.is_file():
            problems.append(f"{f.path} is missing")
        elif p.stat().st_size != f.bytes:
            problems.append(f"{f.path} has {p.stat().st_size} bytes, the build wrote {f.bytes}")
        elif verify_hashes and sha256_file(p) != f.sha256:
            problems.append(f"{f.path} changed since the build (sha256 differs)")
    return problems


# -- what the server runs ---------------------------------------------------------------


@dataclass(frozen=True)
class RuntimeVersions:
    """What a server process runs; compared with what the engines were built for."""

    backend: str
    trtspec: str
    torch: str | None = None
    tensorrt_llm: str | None = None
    gpu_compute_capability: str | None = None  # "9.0"; None when unknown (the check is then skipped)

    @classmethod
    def current(cls, backend: str) -> RuntimeVersions:
        cc = None
        if backend == "trtllm":
            cc = _cuda_compute_capability()
        return cls(
            backend=backend,
            trtspec=trtspec.__version__,
            torch=package_version("torch"),
            tensorrt_llm=package_version("tensorrt_llm") or package_version("tensorrt-llm"),
            gpu_compute_capability=cc,
        )


def _cuda_compute_capability() -> str | None:
    """The first visible GPU's compute capability, read through NVML; None when unknown.

    Not through torch: ``torch.cuda`` would create a CUDA context in the calling process
    (``spec_decode``'s, at load), several hundred MB of GPU memory the engines were planned
    to have. torch answers only where CUDA is initialised already."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(
                pynvml.nvmlDeviceGetHandleByIndex(env_device_index()))
            return f"{major}.{minor}"
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # no NVML (or no GPU) here: try torch, without initialising CUDA
        pass
    try:
        import torch

        if torch.cuda.is_initialized():
            major, minor = torch.cuda.get_device_capability(0)
            return f"{major}.{minor}"
    except Exception:  # no CUDA runtime here: the check is skipped, not failed
        pass
    return None


def major_minor(version: str | None) -> tuple[int, int] | None:
    m = re.match(r"(\d+)\.(\d+)", version or "")
    return (int(m.group(1)), int(m.group(2))) if m else None


def _mm(version: str | None) -> str:
    mm = major_minor(version)
    return f"{mm[0]}.{mm[1]}" if mm else str(version)


def check_manifest(
    manifest: Manifest,
    runtime: RuntimeVersions,
    *,
    engine_dir: Path | None = None,
    verify_hashes: bool = True,
) -> None:
    """Raise :class:`ManifestMismatchError` naming every way ``manifest`` differs from ``runtime``.

    With ``engine_dir`` the recorded files are checked too (sizes, and sha256
    with ``verify_hashes``).
    """
    built = manifest.versions
    problems: list[str] = []
    if manifest.backend != runtime.backend:
        problems.append(f"built for the {manifest.backend} backend, this server runs {runtime.backend}")
    if major_minor(built.trtspec) != major_minor(runtime.trtspec):
        problems.append(f"built with trtspec {built.trtspec}, this server runs {runtime.trtspec}")
    if manifest.backend == "torch" and major_minor(built.torch) != major_minor(runtime.torch):
        problems.append(f"built with torch {_mm(built.torch)}, this server runs torch {_mm(runtime.torch)}")
    if manifest.backend == "trtllm":
        if built.tensorrt_llm != runtime.tensorrt_llm:
            problems.append(
                f"engines built with TensorRT-LLM {built.tensorrt_llm}, this server runs "
                f"{runtime.tensorrt_llm or 'no TensorRT-LLM'} (engines are tied to one version)"
            )
        built_cc = (manifest.gpu or {}).get("compute_capability")
        if built_cc and runtime.gpu_compute_capability and built_cc != runtime.gpu_compute_capability:
            problems.append(
                f"engines built for GPU compute capability {built_cc}, this GPU is {runtime.gpu_compute_capability}"
            )
    if engine_dir is not None:
        problems += file_problems(engine_dir, manifest.files, verify_hashes)
    if problems:
        shown = "; ".join(problems[:5]) + (f"; and {len(problems) - 5} more" if len(problems) > 5 else "")
        raise ManifestMismatchError(
            f"engines {manifest.name!r} do not match this server: {shown}. Rebuild them with `trtspec build`"
        )


def verify_engines(engine_dir: Path, backend: str, verify_hashes: bool = True) -> Manifest:
    """Load ``engine_dir/manifest.json`` and check it against this process; the server's entry point."""
    manifest = load_manifest(engine_dir / MANIFEST_FILE)
    check_manifest(manifest, RuntimeVersions.current(backend), engine_dir=engine_dir, verify_hashes=verify_hashes)
    return manifest


def check_served_engines(manifest_file: str, model_backend: str, manifest_check: str) -> None:
    """``spec_decode``'s check at load: refuse (one line naming every difference) engines built for
    something else than what this server runs (another backend, trtspec/torch/TensorRT-LLM version
    or GPU) or whose files changed since the build; ``manifest_check``: full | quick | off."""
    if not manifest_file or manifest_check == "off":
        return
    backend = "trtllm" if model_backend == "tensorrtllm" else "torch"
    verify_engines(Path(manifest_file).parent, backend, verify_hashes=manifest_check == "full")
