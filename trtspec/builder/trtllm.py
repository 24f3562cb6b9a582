"""The TensorRT-LLM path: engine build commands and ``tensorrtllm``-backend configs.

Targets TensorRT-LLM 1.2.x, the last line with the TensorRT engine path
(``trtllm-build``). Per model, two commands:

1. convert the HF checkpoint into a TensorRT-LLM checkpoint with
   ``MODEL_MAP[arch].from_hugging_face(...).save_checkpoint(...)`` (what
   ``examples/models/core/llama/convert_checkpoint.py`` does, callable without
   the examples tree: :mod:`trtspec.builder.trtllm_convert`); the draft with
   ``QuantConfig(quant_algo=QuantAlgo.W8A16)``: weight-only int8, per channel;
2. ``trtllm-build``: the target for external draft tokens
   (``--speculative_decoding_mode draft_tokens_external --max_draft_len K``),
   both with a paged KV cache and paged context FMHA (needed for KV reuse,
   which draft-target speculation relies on); the draft plain. Neither
   gathers generation logits: ``spec_decode`` sends the target the draft's
   tokens only, and the target engine accepts by token matching
   (:mod:`trtspec.serving.triton.trtllm_bls`), so no logits cross.

The Triton side: one ``tensorrtllm``-backend model per engine (``target``,
``draft``), in-flight fused batching, KV reuse on, and the memory plan's
``kv_cache_free_gpu_mem_fraction`` + ``max_tokens_in_paged_kv_cache`` so the
split does not depend on load order (see :mod:`trtspec.builder.memory`).
Parameter names follow ``all_models/inflight_batcher_llm/tensorrt_llm/config.pbtxt``
of the TensorRT-LLM Triton backend.

Building needs ``tensorrt_llm`` and an NVIDIA GPU; everything else here (the
commands, the configs) is plain data, tested everywhere.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from trtspec.builder.errors import BuildError, TrtllmUnavailableError
from trtspec.builder.manifest import package_version

SUPPORTED_TRTLLM = ((1, 0), (1, 3))  # [1.0, 1.3): the engine path
TRITON_IMAGE = "nvcr.io/nvidia/tritonserver:26.03-trtllm-python-py3"  # ships TensorRT-LLM 1.2.0
ENGINE_DTYPE = "bfloat16"
EXECUTOR_WORKER = "/opt/tritonserver/backends/tensorrtllm/trtllmExecutorWorker"

Runner = Callable[[Sequence[str]], subprocess.CompletedProcess]


def trtllm_version() -> str | None:
    return package_version("tensorrt_llm") or package_version("tensorrt-llm")


def require_trtllm() -> str:
    """The TensorRT-LLM version, or :class:`TrtllmUnavailableError` saying what is missing."""
    version = trtllm_version()
    if version is None:
        raise TrtllmUnavailableError(
            "--backend trtllm needs TensorRT-LLM 1.2.x and an NVIDIA GPU; tensorrt_llm is not installed here "
            f"(use the {TRITON_IMAGE} image, or --dry-run to print the commands and configs)"
        )
    from trtspec.builder.manifest import major_minor

    mm = major_minor(version)
    if mm is None or not (SUPPORTED_TRTLLM[0] <= mm < SUPPORTED_TRTLLM[1]):
        raise TrtllmUnavailableError(
            f"TensorRT-LLM {version} is installed; trtspec builds engines with 1.0-1.2 (later versions dropped "
            f"the TensorRT engine path)"
        )
    import torch

    if not torch.cuda.is_available():
        raise TrtllmUnavailableError(
            "--backend trtllm needs an NVIDIA GPU to build engines and none is visible "
            "(use --dry-run to print the commands and configs)"
        )
    return version


@dataclass(frozen=True)
class EngineSpec:
    """One engine to build: where from, where to, with what limits."""

    role: str  # "target" | "draft"
    hf_dir: Path
    checkpoint_dir: Path  # the intermediate TensorRT-LLM checkpoint
    engine_dir: Path
    architecture: str
    weight_only_int8: bool
    max_batch_size: int
    max_input_len: int
    max_seq_len: int
    max_draft_len: int = 0  # > 0: built for external draft tokens (the target)
    gather_generation_logits: bool = False
    dtype: str = ENGINE_DTYPE

    @property
    def precision(self) -> str:
        return "w8a16" if self.weight_only_int8 else self.dtype


def engine_specs(
    *,
    target_dir: Path,
    draft_dir: Path,
    target_arch: str,
    draft_arch: str,
    engine_root: Path,
    work_dir: Path,
    draft_int8: bool,
    max_draft_len: int,
    max_context: int,
    max_batch_size: int,
) -> tuple[EngineSpec, EngineSpec]:
    if max_draft_len < 1:
        raise BuildError("the TensorRT-LLM target engine needs --max-draft-len >= 1")
    common = dict(max_batch_size=max_batch_size, max_input_len=max_context - 1, max_seq_len=max_context)
    target = EngineSpec(
        role="target",
        hf_dir=target_dir,
        checkpoint_dir=work_dir / "target-ckpt",
        engine_dir=engine_root / "target",
        architecture=target_arch,
        weight_only_int8=False,
        max_draft_len=max_draft_len,
        **common,
    )
    draft = EngineSpec(
        role="draft",
        hf_dir=draft_dir,
        checkpoint_dir=work_dir / "draft-ckpt",
        engine_dir=engine_root / "draft",
        architecture=draft_arch,
        weight_only_int8=draft_int8,
        **common,
    )
    return target, draft


def convert_command(spec: EngineSpec) -> list[str]:
    """HF checkpoint -> TensorRT-LLM checkpoint (run with the Python that has tensorrt_llm)."""
    cmd = [
        sys.executable, "-m", "trtspec.builder.trtllm_convert",
        "--model_dir", str(spec.hf_dir),
        "--output_dir", str(spec.checkpoint_dir),
        "--architecture", spec.architecture,
        "--dtype", spec.dtype,
    ]
    if spec.weight_only_int8:
        cmd += ["--use_weight_only", "--weight_only_precision", "int8"]
    return cmd


def build_command(spec: EngineSpec) -> list[str]:
    """``trtllm-build`` for one engine (TensorRT-LLM 1.2.x option names)."""
    cmd = [
        "trtllm-build",
        "--checkpoint_dir", str(spec.checkpoint_dir),
        "--output_dir", str(spec.engine_dir),
        "--gemm_plugin", "auto",
        "--kv_cache_type", "paged",
        "--use_paged_context_fmha", "enable",
        "--max_beam_width", "1",
        "--max_batch_size", str(spec.max_batch_size),
        "--max_input_len", str(spec.max_input_len),
        "--max_seq_len", str(spec.max_seq_len),
    ]
    if spec.max_draft_len > 0:
        cmd += ["--speculative_decoding_mode", "draft_tokens_external", "--max_draft_len", str(spec.max_draft_len)]
    if spec.gather_generation_logits:
        cmd += ["--gather_generation_logits"]
    return cmd


def build_engines(specs: Sequence[EngineSpec], say: Callable[[str], None], runner: Runner | None = None) -> None:
    """Run conversion and ``trtllm-build`` for each spec; :class:`BuildError` with the tool's last words on failure."""
    run = runner or (lambda cmd: subprocess.run(list(cmd), capture_output=True, text=True))
    for spec in specs:
        for what, cmd in (("converting", convert_command(spec)), ("building", build_command(spec))):
            say(f"{what} the {spec.role} ({spec.precision})")
            proc = run(cmd)
            if proc.returncode != 0:
                tail = (proc.stderr or proc.stdout or "").strip().splitlines()[-3:]
                raise BuildError(f"{what} the {spec.role} engine failed ({cmd[0]} exited {proc.returncode}): "
                                 + (" | ".join(tail) or "no output"))


# -- the Triton model configs ------------------------------------------------------------


@dataclass(frozen=True)
class TrtllmModelConfig:
    """Everything a ``tensorrtllm``-backend ``config.pbtxt`` is filled from."""

    name: str  # Triton model name: "target" | "draft"
    engine_dir: Path
    max_batch_size: int
    max_seq_len: int
    kv_cache_free_gpu_mem_fraction: float
    max_tokens_in_paged_kv_cache: int
    enable_kv_cache_reuse: bool = True
    decoupled: bool = False  # called through BLS by spec_decode, one response per request
    gpu_device_ids: str = "0"
    batch_scheduler_policy: str = "guaranteed_no_evict"
    max_queue_delay_microseconds: int = 0
    instance_count: int = 1

    def parameters(self) -> dict[str, str]:
        """The backend's ``parameters`` (string values, as the backend reads them)."""
        return {
            "max_beam_width": "1",
            "FORCE_CPU_ONLY_INPUT_TENSORS": "no",
            "gpt_model_type": "inflight_fused_batching",
            "gpt_model_path": str(self.engine_dir),
            "max_tokens_in_paged_kv_cache": str(self.max_tokens_in_paged_kv_cache),
            "max_attention_window_size": str(self.max_seq_len),
            "batch_scheduler_policy": self.batch_scheduler_policy,
            "kv_cache_free_gpu_mem_fraction": f"{self.kv_cache_free_gpu_mem_fraction:.2f}",
            "enable_kv_cache_reuse": "true" if self.enable_kv_cache_reuse else "false",
            "exclude_input_in_output": "true",
            "enable_chunked_context": "false",
            "normalize_log_probs": "true",
            "gpu_device_ids": self.gpu_device_ids,
            "executor_worker_path": EXECUTOR_WORKER,
        }


# (name, data type, dims, optional, reshape to scalar, ragged) of the inputs spec_decode uses.
_INPUTS = (
    ("input_ids", "TYPE_INT32", "-1", False, False, True),
    ("input_lengths", "TYPE_INT32", "1", False, True, False),
    ("request_output_len", "TYPE_INT32", "1", False, True, False),
    ("draft_input_ids", "TYPE_INT32", "-1", True, False, True),
    ("draft_logits", "TYPE_FP32", "-1, -1", True, False, True),
    ("draft_acceptance_threshold", "TYPE_FP32", "1", True, True, False),
    ("end_id", "TYPE_INT32", "1", True, True, False),
    ("pad_id", "TYPE_INT32", "1", True, True, False),
    ("stop_words_list", "TYPE_INT32", "2, -1", True, False, True),
    ("bad_words_list", "TYPE_INT32", "2, -1", True, False, True),
    ("beam_width", "TYPE_INT32", "1", True, True, False),
    ("temperature", "TYPE_FP32", "1", True, True, False),
    ("runtime_top_k", "TYPE_INT32", "1", True, True, False),
    ("runtime_top_p", "TYPE_FP32", "1", True, True, False),
    ("seed", "TYPE_UINT64", "1", True, True, False),
    ("return_log_probs", "TYPE_BOOL", "1", True, True, False),
    ("return_context_logits", "TYPE_BOOL", "1", True, True, False),
    ("return_generation_logits", "TYPE_BOOL", "1", True, True, False),
    ("exclude_input_in_output", "TYPE_BOOL", "1", True, True, False),
    ("stop", "TYPE_BOOL", "1", True, True, False),
    ("streaming", "TYPE_BOOL", "1", True, True, False),
)
_OUTPUTS = (
    ("output_ids", "TYPE_INT32", "-1, -1"),
    ("sequence_length", "TYPE_INT32", "-1"),
    ("cum_log_probs", "TYPE_FP32", "-1"),
    ("output_log_probs", "TYPE_FP32", "-1, -1"),
    ("context_logits", "TYPE_FP32", "-1, -1"),
    ("generation_logits", "TYPE_FP32", "-1, -1, -1"),
    ("batch_index", "TYPE_INT32", "1"),
    ("sequence_index", "TYPE_INT32", "1"),
)


def tensorrtllm_model_config(cfg: TrtllmModelConfig) -> dict:
    """The config of one ``tensorrtllm``-backend model in Triton's JSON form, filled from the build."""

    def dims(text: str) -> list[int]:
        return [int(d) for d in text.split(",")]

    inputs = []
    for name, dtype, shape, optional, scalar, ragged in _INPUTS:
        spec: dict = {"name": name, "data_type": dtype, "dims": dims(shape)}
        if scalar:
            spec["reshape"] = {"shape": []}
        if optional:
            spec["optional"] = True
        if ragged:
            spec["allow_ragged_batch"] = True
        inputs.append(spec)
    return {
        "name": cfg.name,
        "backend": "tensorrtllm",
        "max_batch_size": cfg.max_batch_size,
        "model_transaction_policy": {"decoupled": cfg.decoupled},
        "dynamic_batching": {
            "preferred_batch_size": [cfg.max_batch_size],
            "max_queue_delay_microseconds": cfg.max_queue_delay_microseconds,
        },
        "input": inputs,
        "output": [{"name": n, "data_type": t, "dims": dims(d)} for n, t, d in _OUTPUTS],
        "instance_group": [{"count": cfg.instance_count, "kind": "KIND_CPU"}],
        "parameters": {key: {"string_value": value} for key, value in cfg.parameters().items()},
    }


def tensorrtllm_config_pbtxt(cfg: TrtllmModelConfig) -> str:
    """The ``config.pbtxt`` of one ``tensorrtllm``-backend model, filled from the build."""
    from trtspec.builder.repo import render_pbtxt

    return ("# Written by `trtspec build` (TensorRT-LLM backend); rebuild rather than edit.\n"
            + render_pbtxt(tensorrtllm_model_config(cfg)))


def write_trtllm_model(repo_dir: Path, cfg: TrtllmModelConfig) -> Path:
    """Write ``repo_dir/<name>/config.pbtxt`` and the empty version directory ``1/``."""
    model_dir = repo_dir / cfg.name
    (model_dir / "1").mkdir(parents=True, exist_ok=True)
    path = model_dir / "config.pbtxt"
    text = tensorrtllm_config_pbtxt(cfg)
    if not path.is_file() or path.read_text() != text:
        path.write_text(text)
    return path
