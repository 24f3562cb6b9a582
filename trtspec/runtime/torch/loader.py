"""Load a checkpoint (HF directory or ``.gguf`` file) into a runtime.

Precision ``auto`` runs what the checkpoint says: an int8 checkpoint (int8
tensors, or ``trtspec_quantization`` in ``config.json``) as weight-only int8
with bfloat16 activations, an int4 one (uint8 codes, ``llama.stored_float``)
as int4 on the CPU and int8 elsewhere, anything else in float32 on CPU and
bfloat16 on CUDA. ``int4`` (CPU only) runs the layers' matrices as weight-only
int4: an int4 checkpoint's codes as stored, float weights quantized on load
(``llama.quantize_int4``); the embedding and LM head run as int8.

Shapes (lean runtime, :mod:`trtspec.runtime.torch.shapes`): ``exact`` makes
every pass the same number of rows, so speculation changes no bit of the
output; default on for CUDA (padding is nearly free there), off on CPU, where a
padded pass costs what its rows cost (docs/runtime.md has the figures).
``graphs`` (default: on CUDA) replays static-shape passes as CUDA graphs; the
common shapes are captured at load and reported in ``LoadedModel.graphs``.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import torch

from trtspec.errors import CheckpointError
from trtspec.paths import cache_dir
from trtspec.runtime.tokenizer import Tokenizer
from trtspec.runtime.torch import argmax
from trtspec.runtime.torch.hf import HFCausalLM
from trtspec.runtime.torch.lean import LeanLlamaLM
from trtspec.runtime.torch.llama import (
    SUPPORTED_ARCHITECTURES,
    LlamaConfig,
    LlamaWeights,
    int4_unfit,
    kv_dtype,
    lean_runs,
    packs,
)
from trtspec.runtime.torch.shapes import EXACT_ROWS, GRAPH_ROWS, GraphStats, ShapePlan

Precision = Literal["auto", "fp32", "bf16", "fp16", "int8", "int4"]
Impl = Literal["auto", "lean", "hf"]
PRECISIONS = ("auto", "fp32", "bf16", "fp16", "int8", "int4")
QUANTIZED = ("int8", "int4")  # weight-only precisions: bfloat16 activations, the lean runtime only
QUANT_KEY = "trtspec_quantization"
_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass
class LoadedModel:
    lm: LeanLlamaLM | HFCausalLM
    tokenizer: Tokenizer
    path: Path  # the HF directory actually loaded (a converted GGUF lands in the cache)
    precision: str  # fp32 | bf16 | fp16 | int8 | int4
    impl: str  # lean | hf
    config: dict = field(repr=False, default_factory=dict)
    load_time_s: float = 0.0

    @property
    def exact(self) -> bool:
        return isinstance(self.lm, LeanLlamaLM) and self.lm.exact

    @property
    def graphs(self) -> GraphStats | None:
        """Captured shapes, their capture time and memory (``None``: no graphs)."""
        return self.lm.graphs.stats if isinstance(self.lm, LeanLlamaLM) and self.lm.graphs else None

    @property
    def weight_bytes(self) -> int:
        return self.lm.weight_bytes()


def resolve_device(device: str = "auto") -> str:
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise CheckpointError("device 'cuda' asked for, but no CUDA device is available")
    return device


def quiet_transformers() -> None:
    """Silence transformers' own progress bars and info logs (we report progress ourselves)."""
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()


def read_config(path: Path) -> dict:
    cfg_path = path / "config.json"
    if not cfg_path.is_file():
        raise CheckpointError(f"{path} is not a model directory: config.json is missing")
    try:
        return json.loads(cfg_path.read_text())
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{cfg_path} is not valid JSON: {e}") from e


def read_tensors(path: Path) -> dict[str, torch.Tensor]:
    """All tensors of the safetensors files in ``path`` (sharded or not)."""
    from safetensors.torch import load_file

    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"{path} holds no .safetensors weights")
    tensors: dict[str, torch.Tensor] = {}
    for f in files:
        tensors.update(load_file(str(f)))
    return tensors


def gguf_to_hf_dir(gguf: Path, progress: Callable[[str], None] | None = None, out: Path | None = None) -> Path:
    """Dequantize a ``.gguf`` file into an HF safetensors directory, once (cached)."""
    if out is None:
        st = gguf.stat()
        key = hashlib.sha256(f"{gguf.resolve()}:{st.st_size}:{st.st_mtime_ns}".encode()).hexdigest()[:16]
        out = cache_dir() / "gguf" / f"{gguf.stem}-{key}"
    if (out / "config.json").is_file() and list(out.glob("*.safetensors")):
        return out
    from transformers import AutoModelForCausalLM, AutoTokenizer

    quiet_transformers()
    if progress:
        progress(f"converting {gguf.name} to safetensors (once; cached in {out})")
    try:
        tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    except Exception as e:
        raise CheckpointError(f"cannot read GGUF file {gguf}: {e}") from e
    # The weights are now plain float32; drop the GGUF quantizer so they save as such.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    tmp = out.with_name(out.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    model.save_pretrained(str(tmp))
    tok.save_pretrained(str(tmp))
    if out.exists():
        shutil.rmtree(out)
    tmp.rename(out)
    return out


def resolve_checkpoint(path: str | Path, progress: Callable[[str], None] | None = None) -> Path:
    p = Path(path).expanduser()
    if not p.exists():
        raise CheckpointError(f"checkpoint not found: {p}")
    if p.is_file():
        if p.suffix == ".gguf":
            return gguf_to_hf_dir(p, progress)
        raise CheckpointError(f"{p} is a file but not a .gguf checkpoint; pass an HF directory or a .gguf file")
    read_config(p)
    return p


_QUANT_METHODS = {"int8_weight_only": "int8", "int4_weight_only": "int4"}


def checkpoint_precision(cfg: dict, path: Path | None = None, device: str = "cpu") -> str | None:
    """``int8`` or ``int4`` for a quantized checkpoint (``trtspec_quantization`` in the config, or
    int8 / uint8 tensors in ``path``), None for a float one. An int4 checkpoint runs as int8 off the
    CPU (torch's int4 kernel is the CPU's)."""
    q = cfg.get(QUANT_KEY)
    found = _QUANT_METHODS.get(q.get("method")) if isinstance(q, dict) else None
    if found is None and path is not None:
        found = _stored_quantization(path)
    return "int8" if found == "int4" and not device.startswith("cpu") else found


def _stored_quantization(path: Path) -> str | None:
    """``int4`` if a safetensors file in ``path`` holds a uint8 tensor, ``int8`` an int8 one (headers only)."""
    dtypes = {dtype for dtype, _shape in read_headers(path).values()} if any(path.glob("*.safetensors")) else set()
    return "int4" if "U8" in dtypes else "int8" if "I8" in dtypes else None


def read_headers(path: Path) -> dict[str, tuple[str, list[int]]]:
    """Each tensor's safetensors dtype (``F32``, ``I8``, ``U8``, ...) and shape, from the headers of the
    files in ``path`` alone."""
    from safetensors import safe_open

    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"{path} holds no .safetensors weights")
    headers: dict[str, tuple[str, list[int]]] = {}
    for f in files:
        with safe_open(str(f), framework="pt") as st:
            for name in st.keys():
                sl = st.get_slice(name)
                headers[name] = (sl.get_dtype(), list(sl.get_shape()))
    return headers


def int4_draft_unfit(cfg: dict, device: str) -> str | None:
    """Why a draft of config ``cfg`` should not run at int4 on ``device`` (None: it should; then it
    drafts faster than at int8, docs/runtime.md "INT4 draft"): what ``auto`` picks for the demo's
    draft and ``trtspec build --draft-quant auto``."""
    if not device.startswith("cpu"):
        return f"int4 runs on the CPU; the draft runs on {device}"
    if not lean_runs(cfg):
        return f"the lean runtime, which runs int4, supports {', '.join(SUPPORTED_ARCHITECTURES)}"
    return int4_unfit(LlamaConfig.from_hf(cfg))


def compute_dtype(precision: str) -> torch.dtype:
    """The dtype a model computes in at ``precision`` (resolved, not ``auto``): int8 weights run with
    bfloat16 activations."""
    return torch.bfloat16 if precision in QUANTIZED else _DTYPES[precision]


def weights_packed(cfg: dict, precision: str, device: str) -> bool:
    """Whether :func:`load_model` packs the model's matrices (``precision`` resolved): then a tied LM
    head is held twice, the embedding plain for the lookup and the head packed
    (:func:`~trtspec.runtime.torch.llama.packs`; int8 matrices never are)."""
    return lean_runs(cfg) and precision not in QUANTIZED and packs(compute_dtype(precision), torch.device(device).type)


def argmax_head_bytes(cfg: dict, precision: str, device: str, tied: bool) -> int:
    """Bytes :func:`load_model`'s :class:`~trtspec.runtime.torch.argmax.ArgmaxHead` holds beside the
    weights (``precision`` resolved; ``tied``: the LM head is the embedding,
    :func:`~trtspec.runtime.torch.llama.head_tied`; 0 where the model has none)."""
    if not (lean_runs(cfg) and argmax.applies(compute_dtype(precision), torch.device(device).type, tied)):
        return 0
    return argmax.extra_bytes(int(cfg["vocab_size"]), int(cfg["hidden_size"]))


def kv_cache_dtype(cfg: dict, precision: str, device: str) -> torch.dtype:
    """The dtype :func:`load_model` keeps a model's KV cache in (``precision`` resolved): the lean
    runtime's rule (:func:`~trtspec.runtime.torch.llama.kv_dtype`) for the Llama family, the compute
    dtype in transformers'. The build's memory plan counts the cache with it."""
    compute = compute_dtype(precision)
    return kv_dtype(compute, torch.device(device).type) if lean_runs(cfg) else compute


def load_model(
    path: str | Path,
    precision: Precision = "auto",
    device: str = "auto",
    impl: Impl = "auto",
    max_context: int | None = None,
    progress: Callable[[str], None] | None = None,
    exact: bool | None = None,
    graphs: bool | None = None,
) -> LoadedModel:
    """Load ``path`` into the lean runtime (Llama family) or the HF runtime.

    ``exact`` / ``graphs``: ``None`` takes the device's default (module docstring).
    """
    if precision not in PRECISIONS:
        raise CheckpointError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    t0 = time.perf_counter()
    hf_dir = resolve_checkpoint(path, progress)
    cfg = read_config(hf_dir)
    dev = resolve_device(device)
    if precision == "auto":
        precision = checkpoint_precision(cfg, hf_dir, dev) or ("fp32" if dev == "cpu" else "bf16")
    impl = _impl(impl, cfg, hf_dir, precision, dev, exact, graphs)
    on_cuda = dev.startswith("cuda")
    exact = on_cuda if exact is None else exact
    graphs = on_cuda if graphs is None else graphs
    tokenizer = Tokenizer.from_dir(hf_dir)
    if impl == "lean":
        lm: LeanLlamaLM | HFCausalLM = _lean_lm(hf_dir, cfg, precision, dev, max_context, exact, graphs, progress)
    else:
        lm = _hf_lm(hf_dir, precision, dev, max_context)
    return LoadedModel(
        lm=lm,
        tokenizer=tokenizer,
        path=hf_dir,
        precision=precision,
        impl=impl,
        config=cfg,
        load_time_s=time.perf_counter() - t0,
    )


def _impl(impl: Impl, cfg: dict, hf_dir: Path, precision: str, dev: str, exact: bool | None,
          graphs: bool | None) -> str:
    """The runtime to load into (``auto``: the lean one for the Llama family), refusing what it cannot run."""
    lean_ok = lean_runs(cfg)
    if impl == "auto":
        impl = "lean" if lean_ok else "hf"
    if impl == "lean" and not lean_ok:
        raise CheckpointError(f"the lean runtime runs {SUPPORTED_ARCHITECTURES}; {hf_dir} is {cfg.get('architectures') or []}")
    if precision in QUANTIZED and impl != "lean":
        raise CheckpointError(f"{precision} weight-only runs on the lean runtime only (Llama-family checkpoints)")
    if impl != "lean" and (exact or graphs):
        raise CheckpointError("exact mode and CUDA graphs run on the lean runtime only (Llama-family checkpoints)")
    if graphs and not dev.startswith("cuda"):
        raise CheckpointError(f"CUDA graphs need a CUDA device; the model runs on {dev!r}")
    return impl


def _lean_lm(hf_dir: Path, cfg: dict, precision: str, dev: str, max_context: int | None, exact: bool, graphs: bool,
             progress: Callable[[str], None] | None) -> LeanLlamaLM:
    tensors = read_tensors(hf_dir)
    quant = precision if precision in QUANTIZED else None
    weights = LlamaWeights(LlamaConfig.from_hf(cfg), tensors, compute_dtype(precision), dev, quant=quant)
    del tensors
    plan = ShapePlan(exact_rows=EXACT_ROWS if exact else None, rows_buckets=GRAPH_ROWS if graphs else ())
    lm = LeanLlamaLM(weights, max_context=max_context, plan=plan, graphs=graphs)
    if graphs:
        if progress:
            progress("capturing CUDA graphs of the common shapes")
        lm.capture_common()
    return lm


def _hf_lm(hf_dir: Path, precision: str, dev: str, max_context: int | None) -> HFCausalLM:
    from transformers import AutoModelForCausalLM

    quiet_transformers()
    try:
        module = AutoModelForCausalLM.from_pretrained(str(hf_dir), dtype=_DTYPES[precision]).to(dev)
    except Exception as e:
        raise CheckpointError(f"transformers cannot load {hf_dir}: {e}") from e
    return HFCausalLM(module, max_context=max_context)
