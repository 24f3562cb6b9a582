"""The quantized draft: INT8 or INT4 (written here), and what quantization cost.

INT8 (the same scheme as :func:`trtspec.runtime.torch.llama.quantize_int8`):
weight-only, per output channel, symmetric. Every 2-D weight ``W [out, in]``
of the checkpoint (embedding and LM head included) is stored as an int8 tensor
``name`` holding ``q = round(W / s)`` and a float32 tensor ``name + "_scale"``
holding ``s [out] = max|W_row| / 127``; norms and biases stay float32. The
torch runtime runs it with bfloat16 activations (CPU). ``config.json`` carries
``trtspec_quantization``, so ``load_model(path)`` picks int8 by itself.

INT4 (``--draft-quant int4``, the torch runtime on a CPU): the layers'
matrices as :func:`trtspec.runtime.torch.llama.quantize_int4` makes them
(asymmetric, groups of 32 inputs), stored as ``llama.stored_float`` reads
them: uint8 codes, two a byte, and bfloat16 ``_scale`` and ``_zero`` per
group (what the runtime holds, so the checkpoint is what runs); the
embedding and LM head as INT8 above. ``load_model(path)`` picks int4 on a
CPU by itself.

What it cost is measured, not assumed: weight bytes as the runtime holds them
before and after, and the draft's greedy acceptance against the target on a
fixed probe set (``trtspec/data/probe_prompts.json``), with the real
draft-verify loop.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from importlib import resources
from pathlib import Path

import torch

from trtspec.builder.errors import BuildError
from trtspec.errors import CheckpointError
from trtspec.runtime.torch.llama import (
    INT4_GROUP,
    LAYERS,
    SCALE_SUFFIX,
    STORED_FORMS,
    SUPPORTED_ARCHITECTURES,
    ZERO_SUFFIX,
    check_int4_shape,
    is_side_tensor,
    lean_runs,
    pack_int4_codes,
    quantize_int4,
    quantize_int8,
    stored_float,
)
from trtspec.runtime.torch.loader import QUANT_KEY, LoadedModel, load_model, read_config, read_tensors
from trtspec.decoding import AcceptanceRatios, FixedDraftLength, GenerationRequest, SpeculativeDecoder, StopCriteria

Say = Callable[[str], None]

WEIGHT_FILE = "model.safetensors"
# Files of an HF directory that are weights (not copied next to the int8 weights).
_WEIGHT_PATTERNS = ("*.safetensors", "*.safetensors.index.json", "*.bin", "*.bin.index.json", "*.pt", "*.pth", "*.gguf")

INT8_SPEC = {
    "method": "int8_weight_only",
    "granularity": "per_output_channel",
    "symmetric": True,
    "bits": 8,
    "activations": "bfloat16",
    "storage": "int8 tensor NAME + float32 tensor NAME_scale [out]",
}
INT4_SPEC = {
    "method": "int4_weight_only",
    "granularity": f"per group of {INT4_GROUP} inputs (the layers' matrices); embedding and LM head int8 per output channel",
    "symmetric": False,
    "bits": 4,
    "activations": "bfloat16",
    "storage": "uint8 tensor NAME [out, in/2] (two codes a byte, low nibble first) + bfloat16 NAME_scale, "
               f"NAME_zero [out, in/{INT4_GROUP}]; embedding and LM head as int8",
}
QUANT_SPECS = {"int8": INT8_SPEC, "int4": INT4_SPEC}


@dataclass(frozen=True)
class QuantizedCheckpoint:
    path: Path
    precision: str  # int8 | int4
    quantized_matrices: int  # 2-D weights stored as int8 + scale, or int4 codes + scale + zero
    float_tensors: int  # norms, biases: kept float32


def is_weight_file(path: Path) -> bool:
    return any(path.match(p) for p in _WEIGHT_PATTERNS)


def copy_side_files(src: Path, dst: Path) -> list[str]:
    """Copy the non-weight files of an HF dir (tokenizer, generation config, chat template), config.json excluded."""
    copied = []
    for f in sorted(src.iterdir()):
        if f.is_file() and f.name != "config.json" and not is_weight_file(f):
            shutil.copyfile(f, dst / f.name)
            copied.append(f.name)
    return copied


def write_quantized_checkpoint(src: Path, dst: Path, precision: str = "int8") -> QuantizedCheckpoint:
    """Write the weight-only ``precision`` (int8 or int4) copy of the HF checkpoint ``src`` to ``dst``
    (replaced atomically).

    Deterministic: the same ``src`` always gives byte-identical files. A
    matrix already stored in the form it is written in is kept as it is; one
    stored in the other form is dequantized and quantized again.
    """
    cfg = read_config(src)
    archs = cfg.get("architectures") or []
    if not lean_runs(cfg):
        raise BuildError(
            f"a {precision} draft runs on the lean runtime, which supports {', '.join(SUPPORTED_ARCHITECTURES)}; "
            f"the draft is {archs or 'of unknown architecture'} (use --draft-quant none)"
        )
    tensors = read_tensors(src)
    out: dict[str, torch.Tensor] = {}
    quantized = kept_float = 0
    for name in sorted(tensors):
        t = tensors[name]
        if is_side_tensor(tensors, name):
            continue  # written with its matrix below
        if t.dtype in STORED_FORMS or (t.dim() == 2 and t.is_floating_point()):
            out.update(_quantized(tensors, name, _form(name, precision)))
            quantized += 1
        else:
            out[name] = t.float().contiguous()
            kept_float += 1
    if quantized == 0:
        raise BuildError(f"{src} has no 2-D weights to quantize")
    cfg[QUANT_KEY] = dict(QUANT_SPECS[precision])
    _write_dir(src, dst, out, cfg)
    return QuantizedCheckpoint(path=dst, precision=precision, quantized_matrices=quantized, float_tensors=kept_float)


def _form(name: str, precision: str) -> str:
    """How a matrix is written: int4 only the layers' (the embedding and LM head stay int8, as the runtime runs them)."""
    return "int4" if precision == "int4" and name.startswith(LAYERS) else "int8"


def _quantized(tensors: dict[str, torch.Tensor], name: str, form: str) -> dict[str, torch.Tensor]:
    """Matrix ``name`` and its side tensors in ``form``: as stored where it already is, else quantized."""
    t = tensors[name]
    if STORED_FORMS.get(t.dtype) == form:
        sides = (SCALE_SUFFIX, ZERO_SUFFIX) if form == "int4" else (SCALE_SUFFIX,)
        missing = [name + sfx for sfx in sides if name + sfx not in tensors]
        if missing:
            raise BuildError(f"a {form} tensor {name!r} has no {missing[0]!r}")
        side_dtype = torch.bfloat16 if form == "int4" else torch.float32  # as the specs above store them
        return {name: t.contiguous(), **{name + sfx: tensors[name + sfx].to(side_dtype).contiguous() for sfx in sides}}
    w = stored_float(tensors, name)
    if form == "int8":
        q, scale = quantize_int8(w)
        return {name: q.contiguous(), name + SCALE_SUFFIX: scale.contiguous()}
    try:
        check_int4_shape(name, w.shape)
    except CheckpointError as e:
        raise BuildError(f"--draft-quant int4: {e}") from None
    q, scale, zero = quantize_int4(w)
    return {name: pack_int4_codes(q), name + SCALE_SUFFIX: scale.to(torch.bfloat16).contiguous(),
            name + ZERO_SUFFIX: zero.to(torch.bfloat16).contiguous()}


def _write_dir(src: Path, dst: Path, tensors: dict[str, torch.Tensor], cfg: dict) -> None:
    """``dst`` (replaced atomically): ``tensors`` in one safetensors file, ``cfg``, and ``src``'s side files."""
    tmp = dst.with_name(dst.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    from safetensors.torch import save_file

    # One metadata key only: safetensors writes its metadata map in no fixed order.
    save_file(tensors, str(tmp / WEIGHT_FILE), metadata={"format": "pt"})
    (tmp / WEIGHT_FILE).chmod(0o644)  # safetensors writes 0600; servers may run as another user
    (tmp / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    copy_side_files(src, tmp)
    if dst.exists():
        shutil.rmtree(dst)
    tmp.rename(dst)


# -- measuring what it cost -------------------------------------------------------------


def load_probe_prompts(path: Path | None = None) -> list[str]:
    """The probe prompts: ``path`` (JSON: a list, or ``{"prompts": [...]}``) or the packaged set."""
    if path is None:
        text = resources.files("trtspec").joinpath("data/probe_prompts.json").read_text()
    else:
        try:
            text = Path(path).read_text()
        except OSError as e:
            raise BuildError(f"cannot read probe prompts {path}: {e}") from e
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise BuildError(f"probe prompts are not valid JSON: {e}") from e
    prompts = data.get("prompts") if isinstance(data, dict) else data
    if not isinstance(prompts, list) or not prompts or not all(isinstance(p, str) and p for p in prompts):
        raise BuildError("probe prompts must be a non-empty list of non-empty strings")
    return prompts


@dataclass(frozen=True)
class ProbeSettings:
    num_prompts: int = 4  # 0 skips the acceptance measurement
    max_new_tokens: int = 32
    k: int = 5  # draft tokens per iteration (the build's max draft length)
    prompts_file: Path | None = None

    def to_dict(self) -> dict:
        return {"num_prompts": self.num_prompts, "max_new_tokens": self.max_new_tokens, "k": self.k}


@dataclass(frozen=True)
class AcceptanceFigures(AcceptanceRatios):
    """Greedy speculation of one draft against the target over the probe set (summed over prompts)."""

    prompts: int
    iterations: int
    drafted_tokens: int
    accepted_tokens: int
    emitted_tokens: int
    draft_time_s: float

    @property
    def draft_ms_per_token(self) -> float | None:
        return 1000.0 * self.draft_time_s / self.drafted_tokens if self.drafted_tokens else None

    def to_dict(self) -> dict:
        d = asdict(self)
        d["draft_time_s"] = round(self.draft_time_s, 4)
        d["acceptance_rate"] = _round(self.acceptance_rate)
        d["mean_acceptance_length"] = _round(self.mean_acceptance_length)
        d["draft_ms_per_token"] = _round(self.draft_ms_per_token, 2)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> AcceptanceFigures:
        return cls(**{k: d[k] for k in ("prompts", "iterations", "drafted_tokens", "accepted_tokens",
                                         "emitted_tokens", "draft_time_s")})


def _round(x: float | None, nd: int = 4) -> float | None:
    return None if x is None else round(x, nd)


def measure_acceptance(
    target: LoadedModel, draft: LoadedModel, prompts: Sequence[str], max_new_tokens: int, k: int
) -> AcceptanceFigures:
    """Run each prompt through the real draft-verify loop (greedy, fixed ``k``) and sum the stats."""
    tok = target.tokenizer
    decoder = SpeculativeDecoder(target.lm, draft.lm, tok)
    its = drafted = accepted = emitted = 0
    draft_time = 0.0
    for text in prompts:
        req = GenerationRequest(
            prompt_ids=tuple(tok.encode_prompt(text)),
            stop=StopCriteria(max_new_tokens=max_new_tokens, eos_token_ids=tok.eos_token_ids()),
        )
        s = decoder.generate(req, FixedDraftLength(k)).stats
        its += s.iterations
        drafted += s.drafted_tokens
        accepted += s.accepted_tokens
        emitted += s.emitted_tokens
        draft_time += s.draft_time_s
    return AcceptanceFigures(len(prompts), its, drafted, accepted, emitted, round(draft_time, 4))


@dataclass(frozen=True)
class QuantReport:
    """What quantization (INT8 or INT4) did to the draft: memory saved, acceptance lost (or not)."""

    precision_before: str
    precision_after: str
    weight_bytes_before: int  # as the runtime holds them
    weight_bytes_after: int
    acceptance_before: AcceptanceFigures | None  # None: probe skipped (num_prompts 0)
    acceptance_after: AcceptanceFigures | None
    probe: dict
    measured_with: str = "trtspec torch runtime (CPU)"

    @property
    def weight_ratio(self) -> float:
        return self.weight_bytes_after / self.weight_bytes_before

    def to_dict(self) -> dict:
        return {
            "precision_before": self.precision_before,
            "precision_after": self.precision_after,
            "weight_bytes_before": self.weight_bytes_before,
            "weight_bytes_after": self.weight_bytes_after,
            "weight_ratio": round(self.weight_ratio, 4),
            "acceptance_before": self.acceptance_before.to_dict() if self.acceptance_before else None,
            "acceptance_after": self.acceptance_after.to_dict() if self.acceptance_after else None,
            "probe": dict(self.probe),
            "measured_with": self.measured_with,
        }

    @classmethod
    def from_dict(cls, d: dict) -> QuantReport:
        def fig(x: dict | None) -> AcceptanceFigures | None:
            return AcceptanceFigures.from_dict(x) if x else None

        return cls(
            precision_before=d["precision_before"],
            precision_after=d["precision_after"],
            weight_bytes_before=int(d["weight_bytes_before"]),
            weight_bytes_after=int(d["weight_bytes_after"]),
            acceptance_before=fig(d.get("acceptance_before")),
            acceptance_after=fig(d.get("acceptance_after")),
            probe=dict(d.get("probe") or {}),
            measured_with=d.get("measured_with", "trtspec torch runtime (CPU)"),
        )


def measure_quantization(
    target: Path,
    draft_float: Path,
    draft_written: Path | None,
    probe: ProbeSettings,
    say: Say = lambda _m: None,
    precision: str = "int8",
) -> QuantReport:
    """Compare the draft in float with its quantized form (``precision``: int8 or int4), on CPU with
    the torch runtime.

    ``draft_written``: the written checkpoint (loaded as the server will:
    precision ``auto``, which must resolve to ``precision``); ``None`` quantizes
    ``draft_float`` in memory at ``precision``: int4 as the server does, and
    int8 with the same scheme as TensorRT-LLM's W8A16 (per-channel symmetric).
    """
    say("loading the draft in float")
    before = load_model(draft_float, "fp32", device="cpu")
    say(f"loading the {precision} draft")
    after = load_model(draft_written or draft_float, "auto" if draft_written else precision, device="cpu")
    if after.precision != precision:
        raise BuildError(f"the {precision} draft at {draft_written} loads as {after.precision}, not {precision}")
    fig_before = fig_after = None
    if probe.num_prompts > 0:
        prompts = load_probe_prompts(probe.prompts_file)[: probe.num_prompts]
        say("loading the target for the acceptance probe")
        tgt = load_model(target, "auto", device="cpu")
        say(f"probing acceptance before quantization ({len(prompts)} prompts x {probe.max_new_tokens} tokens, k={probe.k})")
        fig_before = measure_acceptance(tgt, before, prompts, probe.max_new_tokens, probe.k)
        say(f"probing acceptance after quantization ({len(prompts)} prompts x {probe.max_new_tokens} tokens, k={probe.k})")
        fig_after = measure_acceptance(tgt, after, prompts, probe.max_new_tokens, probe.k)
    return QuantReport(
        precision_before=before.precision,
        precision_after=after.precision,
        weight_bytes_before=before.weight_bytes,
        weight_bytes_after=after.weight_bytes,
        acceptance_before=fig_before,
        acceptance_after=fig_after,
        probe=probe.to_dict(),
    )
