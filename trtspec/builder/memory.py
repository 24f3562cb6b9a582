"""Memory-pool planner: split one device's memory between draft and target (or give it to a
target served without a draft model).

Two halves, kept apart so the arithmetic is testable with plain numbers:

- **reading** what there is: :func:`read_device_memory` (pynvml on a GPU,
  ``/proc/meminfo`` or psutil on CPU), :func:`runtime_weight_bytes` (from the
  safetensors headers, no weights loaded) and :func:`kv_bytes_per_token`;
- **planning** with it: :func:`plan_memory`, pure arithmetic.

The plan. Of the device's total memory, ``headroom_fraction`` is left alone
(other processes, fragmentation, activations we did not count). From the rest
come both models' weights and a fixed per-process overhead each (CUDA context
and workspaces on a GPU, a Python interpreter with torch on CPU). What remains
is the KV budget. Draft and target hold the same sequences (the draft ``k``
tokens further at most), so every token slot costs ``kv_target + kv_draft``
bytes (``kv_target`` alone without a draft model); the budget buys ``tokens`` slots, capped at what ``max_sessions``
full-context sequences need, and each model's KV pool is ``tokens`` times its
own bytes per token.

TensorRT-LLM sizes a model's paged KV pool, when it loads, as the smaller of
``max_tokens_in_paged_kv_cache`` and ``kv_cache_free_gpu_mem_fraction`` of the
GPU memory free at that moment; so with a fraction alone the model that loads
first takes the larger share. Here the token count is the binding limit, and
each fraction is set high enough that it never binds, even when its model
loads last (the other already holding its weights and its whole pool):
``fraction_m >= kv_m / (total - weights - overheads - kv_other)``. Then
both pools come out the same size whichever loads first.
"""

from __future__ import annotations

import math
import os
from collections.abc import Container
from dataclasses import asdict, dataclass, field
from pathlib import Path

from trtspec.builder.errors import BuildError, MemoryPlanError
from trtspec.runtime.torch.llama import EMBEDDING, INT4_GROUP, LAYERS, LM_HEAD, SCALE_SUFFIX, ZERO_SUFFIX, head_tied
from trtspec.runtime.torch.loader import QUANTIZED, read_headers

GiB = 1 << 30
MiB = 1 << 20
DEFAULT_HEADROOM_FRACTION = 0.10
# Per model process, beside its weights and KV pool.
DEFAULT_OVERHEAD_BYTES = {"gpu": 1 * GiB, "cpu": 512 * MiB}
TRTLLM_TOKENS_PER_BLOCK = 32  # TensorRT-LLM's default paged-KV block
_FRACTION_CEILING = 0.95

_DTYPE_BYTES = {"fp32": 4, "float32": 4, "bf16": 2, "bfloat16": 2, "fp16": 2, "float16": 2, "int8": 1}


# -- what there is ----------------------------------------------------------------------


@dataclass(frozen=True)
class DeviceMemory:
    kind: str  # "gpu" | "cpu"
    name: str
    total_bytes: int
    source: str  # where the number came from: pynvml, /proc/meminfo, psutil, override

    def to_dict(self) -> dict:
        return asdict(self)


def read_device_memory(device: str = "cpu", index: int = 0) -> DeviceMemory:
    """Total memory of the device the models will run on (total, not free: the plan must not depend on the moment)."""
    if device.startswith("cuda"):
        try:
            import pynvml
        except ImportError as e:
            raise BuildError("reading GPU memory needs pynvml (pip install nvidia-ml-py)") from e
        try:
            pynvml.nvmlInit()
            try:
                h = pynvml.nvmlDeviceGetHandleByIndex(index)
                name = pynvml.nvmlDeviceGetName(h)
                total = int(pynvml.nvmlDeviceGetMemoryInfo(h).total)
            finally:
                pynvml.nvmlShutdown()
        except pynvml.NVMLError as e:
            raise BuildError(f"cannot read GPU {index} memory through NVML: {e}") from e
        return DeviceMemory("gpu", name.decode() if isinstance(name, bytes) else str(name), total, "pynvml")
    meminfo = Path("/proc/meminfo")
    if meminfo.is_file():
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemTotal:"):
                return DeviceMemory("cpu", "host RAM", int(line.split()[1]) * 1024, "/proc/meminfo")
    try:
        import psutil
    except ImportError as e:
        raise BuildError("cannot read host memory: no /proc/meminfo and psutil is not installed") from e
    return DeviceMemory("cpu", "host RAM", int(psutil.virtual_memory().total), "psutil")


def parse_bytes(text: str) -> int:
    """``"24GiB"``, ``"512MiB"``, ``"80GB"``, ``"1e9"`` -> bytes."""
    units = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
             "KIB": 1 << 10, "MIB": 1 << 20, "GIB": 1 << 30, "TIB": 1 << 40}
    s = text.strip().upper().replace(" ", "")
    num = s.rstrip("KMGTIB")
    unit = s[len(num):]
    try:
        value = float(num)
    except ValueError:
        raise BuildError(f"cannot read a size from {text!r}; write e.g. 24GiB or 80GB") from None
    if unit not in units or value <= 0:
        raise BuildError(f"cannot read a size from {text!r}; write e.g. 24GiB or 80GB")
    return int(value * units[unit])


def kv_bytes_per_token(cfg: dict, dtype_bytes: int) -> int:
    """Keys and values of one token in every layer: ``layers * 2 * kv_heads * head_dim * dtype_bytes``."""
    heads = int(cfg["num_attention_heads"])
    kv_heads = int(cfg.get("num_key_value_heads") or heads)
    head_dim = int(cfg.get("head_dim") or int(cfg["hidden_size"]) // heads)
    return int(cfg["num_hidden_layers"]) * 2 * kv_heads * head_dim * dtype_bytes


def _tensor_shapes(path: Path) -> dict[str, list[int]]:
    """The shapes of the checkpoint's weights as the runtime reads them: a stored int8 / int4 matrix
    (``llama.stored_float``) as its [out, in], its scale and zero left out (counted with it)."""
    stored = read_headers(path)
    quantized = {name for name, (dtype, _) in stored.items() if dtype in ("I8", "U8")}
    sides = {name + sfx for name in quantized for sfx in (SCALE_SUFFIX, ZERO_SUFFIX)}
    return {name: [shape[0], shape[1] * 2] if dtype == "U8" else shape  # int4: two codes a byte
            for name, (dtype, shape) in stored.items() if name not in sides}


def runtime_weight_bytes(
    path: Path, cfg: dict, precision: str, int8_exclude: tuple[str, ...] = (), packed: bool = False
) -> int:
    """Bytes of weights a runtime holds for the checkpoint at ``path`` in ``precision``.

    Matches the torch runtime: ``fp32``/``bf16``/``fp16``: every parameter at
    that width; ``int8``: each matrix 1 byte per weight plus one 2-byte
    (bfloat16) scale per row, vectors in bfloat16; ``int4``: the layers'
    matrices half a byte per weight plus a bfloat16 scale and zero per group
    of ``INT4_GROUP``, the rest as under ``int8``. A tied LM head is counted
    once, or twice when the runtime packs its matrices (``packed``,
    ``loader.weights_packed``: the embedding stays plain for the lookup).
    ``int8_exclude``: name fragments of matrices kept at 2 bytes under
    int8 (TensorRT-LLM's W8A16 leaves the embedding and LM head in 16 bits).
    """
    if precision not in _DTYPE_BYTES and precision not in QUANTIZED:
        raise BuildError(f"unknown precision {precision!r}")
    shapes = _tensor_shapes(path)
    tied = _tied(cfg, shapes)
    total = 0
    for name, shape in shapes.items():
        if "rotary_emb" in name or (tied and name == LM_HEAD):
            continue
        numel = math.prod(shape) if shape else 1
        if precision == "int4" and len(shape) == 2 and name.startswith(LAYERS):  # packed nibbles, bf16 scale + zero
            total += numel // 2 + numel // INT4_GROUP * 2 * _DTYPE_BYTES["bf16"]
        elif precision in QUANTIZED:
            if len(shape) == 2 and not any(x in name for x in int8_exclude):
                total += numel + shape[0] * 2
            else:
                total += numel * 2
        else:
            total += numel * _DTYPE_BYTES[precision] * (2 if packed and tied and name == EMBEDDING else 1)
    return total


def checkpoint_head_tied(path: Path, cfg: dict) -> bool:
    """Whether the runtime holds the checkpoint at ``path`` with its LM head tied to the embedding
    (:func:`~trtspec.runtime.torch.llama.head_tied`: ``tie_word_embeddings``, or no LM head in the weights)."""
    return _tied(cfg, _tensor_shapes(path))


def _tied(cfg: dict, tensor_names: Container[str]) -> bool:
    return head_tied(bool(cfg.get("tie_word_embeddings", False)), tensor_names)


# -- the plan ---------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelFootprint:
    """What one model needs, independent of load."""

    role: str  # "target" | "draft"
    weight_bytes: int
    kv_bytes_per_token: int
    overhead_bytes: int

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class PoolShare:
    """One model's share of the device."""

    role: str
    weight_bytes: int
    overhead_bytes: int
    kv_bytes_per_token: int
    kv_tokens: int  # token slots in its KV pool
    kv_bytes: int
    # TensorRT-LLM settings that make the share independent of load order.
    kv_cache_free_gpu_mem_fraction: float
    max_tokens_in_paged_kv_cache: int

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class MemoryPlan:
    device: DeviceMemory
    headroom_fraction: float
    headroom_bytes: int
    max_context: int
    max_draft_len: int
    tokens_per_sequence: int  # KV slots one full sequence holds (context + draft tokens, block-rounded)
    requested_sessions: int
    sessions: int  # full-context sequences both pools hold at once
    target: PoolShare
    draft: PoolShare | None  # None: no draft model
    spare_bytes: int  # budget left after the pools (when sessions, not memory, limited them)
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def shares(self) -> tuple[PoolShare, ...]:
        """The pools planned: the target's, then the draft's when there is one."""
        return (self.target,) if self.draft is None else (self.target, self.draft)

    @property
    def used_bytes(self) -> int:
        return sum(s.weight_bytes + s.overhead_bytes + s.kv_bytes for s in self.shares)

    def to_dict(self) -> dict:
        return {
            "device": self.device.to_dict(),
            "headroom_fraction": self.headroom_fraction,
            "headroom_bytes": self.headroom_bytes,
            "max_context": self.max_context,
            "max_draft_len": self.max_draft_len,
            "tokens_per_sequence": self.tokens_per_sequence,
            "requested_sessions": self.requested_sessions,
            "sessions": self.sessions,
            "used_bytes": self.used_bytes,
            "spare_bytes": self.spare_bytes,
            "target": self.target.to_dict(),
            "draft": self.draft.to_dict() if self.draft else None,
            "notes": list(self.notes),
        }

    def trtllm_settings(self) -> dict[str, dict]:
        return {
            s.role: {
                "kv_cache_free_gpu_mem_fraction": s.kv_cache_free_gpu_mem_fraction,
                "max_tokens_in_paged_kv_cache": s.max_tokens_in_paged_kv_cache,
            }
            for s in self.shares
        }


def _gib(n: float) -> str:
    return f"{n / GiB:.2f} GiB"


def _fraction_ceil(x: float) -> float:
    """Round a fraction up to the next hundredth, plus one hundredth of margin."""
    return round(math.ceil(x * 100 - 1e-9) / 100 + 0.01, 2)


def plan_memory(
    device: DeviceMemory,
    target: ModelFootprint,
    draft: ModelFootprint | None,
    max_context: int,
    max_sessions: int,
    max_draft_len: int,
    headroom_fraction: float = DEFAULT_HEADROOM_FRACTION,
    tokens_per_block: int = 1,
) -> MemoryPlan:
    """Split ``device`` between the two models (``draft`` None: the target alone); :class:`MemoryPlanError`
    when they do not fit."""
    if not 0.0 <= headroom_fraction < 1.0:
        raise BuildError(f"headroom fraction must be in [0, 1), got {headroom_fraction}")
    if max_context < 2 or max_sessions < 1 or max_draft_len < 0 or tokens_per_block < 1:
        raise BuildError("max context must be >= 2, sessions >= 1, draft length >= 0, block >= 1")
    total = device.total_bytes
    headroom = int(total * headroom_fraction)
    models = (target,) if draft is None else (target, draft)
    fixed = sum(m.weight_bytes + m.overhead_bytes for m in models)
    kv_budget = _kv_budget(device, models, headroom_fraction)
    per_seq = math.ceil((max_context + max_draft_len) / tokens_per_block) * tokens_per_block
    per_token = sum(m.kv_bytes_per_token for m in models)
    if per_token <= 0:
        raise BuildError("KV bytes per token must be positive")
    if per_seq * per_token > kv_budget:
        raise MemoryPlanError(
            f"not even one sequence fits in {device.name} ({_gib(total)}): a {max_context}-token context needs "
            f"{_gib(per_seq * per_token)} of KV cache ({' + '.join(m.role for m in models)}), only {_gib(kv_budget)} remain after "
            f"weights and overhead; lower --max-context or use a smaller model"
        )
    affordable = (kv_budget // per_token) // tokens_per_block * tokens_per_block
    wanted = per_seq * max_sessions
    tokens = min(affordable, wanted)
    sessions = tokens // per_seq
    notes: list[str] = []
    if sessions < max_sessions:
        notes.append(f"memory holds {sessions} full-context sessions, fewer than the {max_sessions} asked for")
    kv_all = tokens * per_token

    def share(m: ModelFootprint) -> PoolShare:
        return _pool_share(m, tokens, free_when_last=total - fixed - (kv_all - tokens * m.kv_bytes_per_token))

    return MemoryPlan(
        device=device,
        headroom_fraction=headroom_fraction,
        headroom_bytes=headroom,
        max_context=max_context,
        max_draft_len=max_draft_len,
        tokens_per_sequence=per_seq,
        requested_sessions=max_sessions,
        sessions=sessions,
        target=share(target),
        draft=share(draft) if draft is not None else None,
        spare_bytes=kv_budget - kv_all,
        notes=tuple(notes),
    )


def _kv_budget(device: DeviceMemory, models: tuple[ModelFootprint, ...], headroom_fraction: float) -> int:
    """Bytes left for KV caches once headroom, weights and overheads are taken; :class:`MemoryPlanError`
    when nothing is left."""
    usable = device.total_bytes - int(device.total_bytes * headroom_fraction)
    budget = usable - sum(m.weight_bytes + m.overhead_bytes for m in models)
    if budget <= 0:
        weights = " + ".join(f"{_gib(m.weight_bytes)} ({m.role})" for m in models)
        raise MemoryPlanError(
            f"the models do not fit in {device.name} ({_gib(device.total_bytes)}): weights {weights} "
            f"+ overhead {_gib(sum(m.overhead_bytes for m in models))} "
            f"exceed the {_gib(usable)} usable after {headroom_fraction:.0%} headroom"
        )
    return budget


def _pool_share(m: ModelFootprint, tokens: int, free_when_last: int) -> PoolShare:
    """``m``'s pool of ``tokens`` slots; its TensorRT-LLM fraction is set for the worst case, ``m`` loading
    last with ``free_when_last`` bytes free (the other model holding its weights and whole pool)."""
    kv_m = tokens * m.kv_bytes_per_token
    fraction = _fraction_ceil(kv_m / free_when_last)
    if fraction > _FRACTION_CEILING:
        raise MemoryPlanError(
            f"the {m.role} KV pool ({_gib(kv_m)}) would need {fraction:.0%} of the memory free when it loads; "
            f"lower --max-sessions or --max-context"
        )
    return PoolShare(
        role=m.role,
        weight_bytes=m.weight_bytes,
        overhead_bytes=m.overhead_bytes,
        kv_bytes_per_token=m.kv_bytes_per_token,
        kv_tokens=tokens,
        kv_bytes=kv_m,
        kv_cache_free_gpu_mem_fraction=fraction,
        max_tokens_in_paged_kv_cache=tokens,
    )


def device_override(total_bytes: int, kind: str) -> DeviceMemory:
    """A device of a given size (planning for another machine, or tests)."""
    return DeviceMemory(kind, f"{kind} (size given)", total_bytes, "override")


def env_device_index() -> int:
    """The first visible GPU's NVML index (``CUDA_VISIBLE_DEVICES`` honoured when it names an index)."""
    first = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0].strip()
    return int(first) if first.isdigit() else 0
