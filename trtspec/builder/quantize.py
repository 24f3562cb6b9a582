"""The quantized draft: INT8 (written) or INT4 (quantized at load), and what quantization cost.

Scheme (the same as :func:`trtspec.runtime.torch.llama.quantize_int8`):
weight-only, per output channel, symmetric. Every 2-D weight ``W [out, in]``
of the checkpoint (embedding and LM head included) is stored as an int8 tensor
``name`` holding ``q = round(W / s)`` and a float32 tensor ``name + "_scale"``
holding ``s [out] = max|W_row| / 127``; norms and biases stay float32. The
torch runtime runs it with bfloat16 activations (CPU). ``config.json`` carries
``trtspec_quantization``, so ``load_model(path)`` picks int8 by itself.

INT4 (``--draft-quant int4``, the torch runtime on a CPU): the draft's float
checkpoint is kept as it is and served at precision ``int4``, which quantizes
the layers' matrices at load (:func:`trtspec.runtime.torch.llama.quantize_int4`:
asymmetric, groups of 32 inputs), the embedding and LM head to int8 as above.

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
from trtspec.runtime.torch.llama import INT4_GROUP, SUPPORTED_ARCHITECTURES, lean_runs, quantize_int8
from trtspec.runtime.torch.loader import QUANT_KEY, LoadedModel, load_model, read_config, read_tensors
from trtspec.decoding import AcceptanceRatios, FixedDraftLength, GenerationRequest, SpeculativeDecoder, StopCriteria

Say = Callable[[str], None]

SCALE_SUFFIX = "_scale"
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
    "storage": "the float checkpoint; quantized when the runtime loads it (precision int4, CPU)",
}
QUANT_SPECS = {"int8": INT8_SPEC, "int4": INT4_SPEC}


@dataclass(frozen=True)
class Int8Checkpoint:
    path: Path
    quantized_matrices: int  # 2-D weights stored as int8 + scale
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


def write_int8_checkpoint(src: Path, dst: Path) -> Int8Checkpoint:
    """Write the weight-only int8 copy of the HF checkpoint ``src`` to ``dst`` (replaced atomically).

    Deterministic: the same ``src`` always gives byte-identical files. A
    matrix already stored as int8 + scale is kept as it is.
    """
    cfg = read_config(src)
    archs = cfg.get("architectures") or []
    if not lean_runs(cfg):
        raise BuildError(
            f"an int8 draft runs on the lean runtime, which supports {', '.join(SUPPORTED_ARCHITECTURES)}; "
            f"the draft is {archs or 'of unknown architecture'} (use --draft-quant none)"
        )
    tensors = read_tensors(src)
    out: dict[str, torch.Tensor] = {}
    quantized = kept_float = 0
    for name in sorted(tensors):
        t = tensors[name]
        if name.endswith(SCALE_SUFFIX) and tensors.get(name[: -len(SCALE_SUFFIX)], t).dtype == torch.int8:
            continue  # written with its matrix below
        if t.dtype == torch.int8:
            scale = tensors.get(name + SCALE_SUFFIX)
            if scale is None:
                raise BuildError(f"{src}: int8 tensor {name!r} has no {name + SCALE_SUFFIX!r}")
            out[name], out[name + SCALE_SUFFIX] = t.contiguous(), scale.float().contiguous()
            quantized += 1
        elif t.dim() == 2 and t.is_floating_point():
            q, scale = quantize_int8(t)
            out[name], out[name + SCALE_SUFFIX] = q.contiguous(), scale.contiguous()
            quantized += 1
        else:
            out[name] = t.float().contiguous()
            kept_float += 1
    if quantized == 0:
        raise BuildError(f"{src} has no 2-D weights to quantize")
    cfg[QUANT_KEY] = dict(INT8_SPEC)
    tmp = dst.with_name(dst.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    from safetensors.torch import save_file

    # One metadata key only: safetensors writes its metadata map in no fixed order.
    save_file(out, str(tmp / WEIGHT_FILE), metadata={"format": "pt"})
    (tmp / WEIGHT_FILE).chmod(0o644)  # safetensors writes 0600; servers may run as another user
    (tmp / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    copy_side_files(src, tmp)
    if dst.exists():
        shutil.rmtree(dst)
    tmp.rename(dst)
    return Int8Checkpoint(path=dst, quantized_matrices=quantized, float_tensors=kept_float)


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
    draft_int8: Path | None,
    probe: ProbeSettings,
    say: Say = lambda _m: None,
    precision: str = "int8",
) -> QuantReport:
    """Compare the draft in float with its quantized form (``precision``: int8 or int4), on CPU with
    the torch runtime.

    ``draft_int8``: the written int8 checkpoint (loaded as the server will:
    precision ``auto``, which must resolve to int8); ``None`` quantizes
    ``draft_float`` in memory at ``precision``: int4 as the server does, and
    int8 with the same scheme as TensorRT-LLM's W8A16 (per-channel symmetric).
    """
    say("loading the draft in float")
    before = load_model(draft_float, "fp32", device="cpu")
    say(f"loading the {precision} draft")
    after = load_model(draft_int8, "auto", device="cpu") if draft_int8 else load_model(draft_float, precision, device="cpu")
    if after.precision != precision:
        raise BuildError(f"the {precision} draft at {draft_int8} loads as {after.precision}, not {precision}")
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
