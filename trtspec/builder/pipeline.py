"""``trtspec build``: check -> quantize -> compile -> memory plan -> manifest -> model repo.

Without a draft checkpoint the build serves the target alone: nothing to
quantize or probe, a memory plan and manifest of the target only, and
``spec_decode`` drafting with a free drafter (n-gram or suffix lookups in the
request's text, no model call).

Each step reports through a :data:`Progress` callback (the CLI draws it; the
library prints nothing). Re-running is idempotent: the inputs (source files,
the options that shape the engines, the versions) are hashed into the
manifest; when a rebuild finds the same hash and its files intact, it skips
quantizing and compiling, reuses the figures it measured, and rewrites only
what differs, so a rebuild of unchanged inputs leaves every file as it was.
"""

from __future__ import annotations

import filecmp
import hashlib
import json
import re
import shutil
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Literal

from trtspec.builder import trtllm
from trtspec.builder.errors import BuildError
from trtspec.builder.manifest import (
    MANIFEST_FILE,
    Manifest,
    ModelEntry,
    Quantization,
    Versions,
    file_problems,
    hash_files,
    load_manifest,
    sha256_file,
)
from trtspec.builder.memory import (
    DEFAULT_HEADROOM_FRACTION,
    DEFAULT_OVERHEAD_BYTES,
    TRTLLM_TOKENS_PER_BLOCK,
    DeviceMemory,
    MemoryPlan,
    ModelFootprint,
    checkpoint_head_tied,
    device_override,
    env_device_index,
    kv_bytes_per_token,
    plan_memory,
    read_device_memory,
    runtime_weight_bytes,
)
from trtspec.builder.quantize import (
    QUANT_SPECS,
    ProbeSettings,
    QuantReport,
    copy_side_files,
    measure_quantization,
    write_quantized_checkpoint,
)
from trtspec.builder.repo import default_drafter_for, write_model_repo
from trtspec.errors import TrtspecError
from trtspec.runtime.compat import CompatReport, check_compatible, target_facts
from trtspec.runtime.tokenizer import Tokenizer
from trtspec.runtime.torch.loader import (
    argmax_head_bytes,
    checkpoint_precision,
    int4_draft_unfit,
    kv_cache_dtype,
    read_config,
    resolve_checkpoint,
    resolve_device,
    weights_packed,
)
from trtspec.wire import DRAFTERS, SPEC_DECODE, SpecDecodeParams

STEPS = ("check", "quantize", "compile", "memory", "manifest", "model_repo")
STEP_TITLES = {
    "check": "Check the models (a draft against the target)",
    "quantize": "Quantize the draft",
    "compile": "Compile",
    "memory": "Plan the memory pools",
    "manifest": "Write the manifest",
    "model_repo": "Write the model repository",
}
WORK_DIR = "work"  # intermediate files of the TensorRT-LLM path, under the engine directory


@dataclass(frozen=True)
class StepEvent:
    step: str  # one of STEPS
    status: Literal["start", "info", "done", "skipped"]
    message: str = ""


Progress = Callable[[StepEvent], None]


DRAFT_QUANTS = ("auto", "int8", "int4", "none")


@dataclass(frozen=True)
class BuildOptions:
    target: Path
    draft: Path | None = None  # None: the target alone, speculating with the free drafters
    name: str | None = None  # engines/<name>; default: the target directory's name
    engines_dir: Path = Path("engines")
    model_repo: Path | None = Path("model_repo")  # None: do not write one
    model_name: str = SPEC_DECODE  # the name spec_decode is served under
    backend: Literal["torch", "trtllm"] = "torch"
    draft_quant: Literal["auto", "int8", "int4", "none"] = "auto"  # auto: int4 where it runs fast (_auto_draft_quant), else int8
    max_draft_len: int = SpecDecodeParams.draft_length  # k, for the free drafters too
    default_drafter: str | None = None  # model | ngram | suffix | auto; None: default_drafter_for(a draft given)
    policy_file: Path | None = None
    max_context: int | None = None  # default: what both models support
    max_sessions: int = 8  # concurrent sequences the pools are sized for (TensorRT-LLM: max batch size)
    max_tokens_limit: int = SpecDecodeParams.max_tokens_limit  # most new tokens one request may ask for (served models enforce it)
    probe: ProbeSettings = field(default_factory=ProbeSettings)
    headroom_fraction: float = DEFAULT_HEADROOM_FRACTION
    device_memory_bytes: int | None = None  # plan for a device of this size instead of reading this host's
    dry_run: bool = False  # check, measure and plan; write nothing (TensorRT-LLM: print the commands and configs)
    force: bool = False  # rebuild even when the inputs are unchanged

    @property
    def drafter(self) -> str:
        """What drafts for served requests that name no drafter."""
        return self.default_drafter or default_drafter_for(self.draft is not None)

    @property
    def applied_draft_quant(self) -> str | None:
        """``draft_quant`` (resolved by the check step where it is ``auto``), or None without a draft model."""
        return self.draft_quant if self.draft is not None else None

    def validate(self) -> None:
        if self.backend not in ("torch", "trtllm"):
            raise BuildError(f"backend must be torch or trtllm, got {self.backend!r}")
        if self.default_drafter is not None and self.default_drafter not in DRAFTERS:
            raise BuildError(f"--default-drafter must be one of {', '.join(DRAFTERS)}, got {self.default_drafter!r}")
        if self.draft is None and self.backend == "trtllm":
            raise BuildError("--backend trtllm needs --draft: a repository without a draft model is built "
                             "for the torch backend only")
        if self.draft is None and self.default_drafter == "model":
            raise BuildError("--default-drafter model needs a draft model: pass --draft, or choose ngram, suffix or auto")
        if self.draft_quant not in DRAFT_QUANTS:
            raise BuildError(f"--draft-quant must be one of {', '.join(DRAFT_QUANTS)}, got {self.draft_quant!r}")
        if self.draft_quant == "int4" and self.backend == "trtllm":
            raise BuildError("--draft-quant int4 is the torch runtime's (CPU); --backend trtllm builds the "
                             "draft as W8A16 (int8) or as it is (none)")
        if not 1 <= self.max_draft_len <= 64:
            raise BuildError(f"--max-draft-len must be in [1, 64], got {self.max_draft_len}")
        if self.max_sessions < 1:
            raise BuildError(f"--max-sessions must be >= 1, got {self.max_sessions}")
        if self.max_tokens_limit < 1:
            raise BuildError(f"--max-tokens-limit must be >= 1, got {self.max_tokens_limit}")
        if self.max_context is not None and self.max_context < 2:
            raise BuildError(f"--max-context must be >= 2, got {self.max_context}")
        if self.probe.num_prompts < 0 or self.probe.max_new_tokens < 1:
            raise BuildError("--probe-prompts must be >= 0 and --probe-tokens >= 1")
        if self.name is not None and not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", self.name):
            raise BuildError(f"--name must be letters, digits, '.', '_' or '-', got {self.name!r}")


@dataclass
class StepRecord:
    name: str
    status: str  # done | skipped | dry-run
    seconds: float
    detail: str = ""

    def to_dict(self) -> dict:
        return {"name": self.name, "status": self.status, "seconds": round(self.seconds, 3), "detail": self.detail}


@dataclass
class BuildResult:
    name: str
    backend: str
    dry_run: bool
    engine_dir: Path
    model_repo: Path | None
    manifest_path: Path
    manifest: Manifest
    compat: CompatReport
    quantization: QuantReport | None
    memory_plan: MemoryPlan
    default_drafter: str  # what drafts for served requests that name no drafter
    reused: bool  # quantize and compile skipped: the inputs had not changed
    steps: list[StepRecord]
    trtllm_commands: list[list[str]] = field(default_factory=list)
    trtllm_configs: dict[str, str] = field(default_factory=dict)  # model name -> config.pbtxt
    notes: list[str] = field(default_factory=list)

    @property
    def has_draft(self) -> bool:
        return self.memory_plan.draft is not None

    def to_dict(self) -> dict:
        d = {
            "name": self.name,
            "backend": self.backend,
            "dry_run": self.dry_run,
            "reused": self.reused,
            "engine_dir": str(self.engine_dir),
            "model_repo": str(self.model_repo) if self.model_repo else None,
            "manifest_path": str(self.manifest_path),
            "draft_model": self.has_draft,
            "default_drafter": self.default_drafter,
            "steps": [s.to_dict() for s in self.steps],
            "compat": self.compat.to_dict(),
            "quantization": self.quantization.to_dict() if self.quantization else None,
            "memory_plan": self.memory_plan.to_dict(),
            "manifest": self.manifest.model_dump(mode="json"),
            "notes": list(self.notes),
        }
        if self.backend == "trtllm":
            d["trtllm"] = {"commands": self.trtllm_commands, "configs": self.trtllm_configs}
        return d


class _Reporter:
    """Times steps and forwards events to the caller's progress callback."""

    def __init__(self, progress: Progress | None) -> None:
        self._emit = progress or (lambda _e: None)
        self.records: list[StepRecord] = []

    def info(self, step: str, message: str) -> None:
        self._emit(StepEvent(step, "info", message))

    def say(self, step: str) -> Callable[[str], None]:
        return lambda m: self.info(step, m)

    @contextmanager
    def step(self, name: str) -> Iterator[StepRecord]:
        rec = StepRecord(name, "done", 0.0)
        self._emit(StepEvent(name, "start", STEP_TITLES[name]))
        t0 = time.perf_counter()
        yield rec
        rec.seconds = time.perf_counter() - t0
        self.records.append(rec)
        self._emit(StepEvent(name, "skipped" if rec.status == "skipped" else "done", rec.detail))

    def skip(self, name: str, why: str) -> None:
        self._emit(StepEvent(name, "start", STEP_TITLES[name]))
        self.records.append(StepRecord(name, "skipped", 0.0, why))
        self._emit(StepEvent(name, "skipped", why))


# -- small helpers ------------------------------------------------------------------------


class _Hashes:
    """sha256 of files, each read once per build."""

    def __init__(self) -> None:
        self._memo: dict[Path, str] = {}

    def file(self, p: Path) -> str:
        key = p.resolve()
        if key not in self._memo:
            self._memo[key] = sha256_file(key)
        return self._memo[key]

    def directory(self, d: Path) -> str:
        h = hashlib.sha256()
        for f in sorted(x for x in d.iterdir() if x.is_file()):
            h.update(f"{f.name}\t{self.file(f)}\n".encode())
        return h.hexdigest()


def _default_name(target: Path) -> str:
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", target.name).strip("-.") or "model"
    return name


def _validate_policy(path: Path) -> None:
    if not path.is_file():
        raise BuildError(f"policy file not found: {path}")
    from trtspec.control import load_policy

    load_policy(path)


def _checkpoint_files(src: Path) -> list[Path]:
    """The files of an HF directory a runtime needs: config, weights, tokenizer and friends."""
    return sorted(f for f in src.iterdir() if f.is_file() and not f.name.endswith(".tmp"))


def _sync_dir(files: list[Path], dst: Path) -> int:
    """Make ``dst`` hold exactly ``files`` (by name); copy only what differs. Returns files copied."""
    dst.mkdir(parents=True, exist_ok=True)
    wanted = {f.name: f for f in files}
    for extra in dst.iterdir():
        if extra.name not in wanted:
            shutil.rmtree(extra) if extra.is_dir() else extra.unlink()
    copied = 0
    for name, src in wanted.items():
        out = dst / name
        if out.is_file() and out.stat().st_size == src.stat().st_size and filecmp.cmp(src, out, shallow=False):
            continue
        tmp = out.with_name(out.name + ".tmp")
        shutil.copyfile(src, tmp)
        tmp.replace(out)
        copied += 1
    return copied


def _engine_files(engine_dir: Path) -> list[Path]:
    return sorted(
        p for p in engine_dir.rglob("*")
        if p.is_file() and p.name != MANIFEST_FILE and not p.name.endswith(".tmp")
        and WORK_DIR not in p.relative_to(engine_dir).parts[:1]
    )


def _gpu_info() -> dict | None:
    try:
        import torch

        if torch.cuda.is_available():
            major, minor = torch.cuda.get_device_capability(0)
            return {"name": torch.cuda.get_device_name(0), "compute_capability": f"{major}.{minor}"}
    except Exception:  # no usable CUDA: nothing to record
        pass
    return None


def _reusable(manifest_path: Path, engine_dir: Path, inputs_sha256: str) -> Manifest | None:
    """The previous manifest when its inputs hash matches and its files are intact."""
    prev = _previous_manifest(manifest_path)
    if prev is None or prev.inputs_sha256 != inputs_sha256 or file_problems(engine_dir, prev.files, verify_hashes=True):
        return None
    return prev


@dataclass(frozen=True)
class _Side:
    role: str
    src: Path  # the HF directory (a .gguf converted once into the cache)
    cfg: dict
    arch: str
    precision: str  # what the server runs it at


@dataclass
class _Ctx:
    """What the steps hand on to each other."""

    opts: BuildOptions
    rep: _Reporter
    hashes: _Hashes
    notes: list[str]
    target: _Side
    draft: _Side | None  # None: no draft model
    compat: CompatReport
    max_context: int
    plan: MemoryPlan
    name: str
    engine_dir: Path
    inputs: dict
    inputs_sha256: str
    prev: Manifest | None  # the previous build, when its inputs equal these and its files are intact
    trt_version: str | None
    device: str  # where the server runs the models: cpu | cuda

    @property
    def int8(self) -> bool:
        """An int8 draft: written here (torch) or built as W8A16 (TensorRT-LLM)."""
        return self.opts.applied_draft_quant == "int8"

    @property
    def draft_written(self) -> bool:
        """Whether the quantize step writes the draft the server loads (torch: int8 or int4), not a copy."""
        return self.opts.backend == "torch" and self.opts.applied_draft_quant in QUANT_SPECS

    @property
    def manifest_path(self) -> Path:
        return self.engine_dir / MANIFEST_FILE


# -- the pipeline -------------------------------------------------------------------------


def run_build(opts: BuildOptions, progress: Progress | None = None) -> BuildResult:
    """Build engines, manifest and model repository for one draft/target pair (or a target alone)."""
    opts.validate()
    rep = _Reporter(progress)
    with rep.step("check") as rec:
        ctx = _check(opts, rep)
        rec.detail = (f"vocab {ctx.compat.vocab_size}, tokenizer {ctx.compat.tokenizer_fingerprint}, "
                      f"max context {ctx.max_context}" + ("" if ctx.draft else "; no draft model: the target alone")
                      + ("; inputs unchanged since the last build" if ctx.prev else ""))
    quant = _quantize(ctx)
    specs = _engine_specs(ctx)
    commands = [c for s in specs for c in (trtllm.convert_command(s), trtllm.build_command(s))]
    _compile(ctx, specs)
    with rep.step("memory") as rec:  # planned in the check step, so a pair that cannot fit fails before any work
        plan, dev = ctx.plan, ctx.plan.device
        rep.info("memory", f"{dev.name}: {dev.total_bytes / (1 << 30):.2f} GiB ({dev.source})")
        rec.detail = (f"{plan.sessions} sessions x {plan.tokens_per_sequence} tokens; "
                      + ", ".join(f"{s.role} KV {s.kv_bytes / (1 << 20):.1f} MiB" for s in plan.shares))
    manifest = _manifest(ctx, quant, commands)
    trt_models = _trtllm_models(ctx)
    _model_repo(ctx, trt_models)
    return BuildResult(
        name=ctx.name,
        backend=opts.backend,
        dry_run=opts.dry_run,
        engine_dir=ctx.engine_dir,
        model_repo=opts.model_repo,
        manifest_path=ctx.manifest_path,
        manifest=manifest,
        compat=ctx.compat,
        quantization=quant,
        memory_plan=ctx.plan,
        default_drafter=opts.drafter,
        reused=ctx.prev is not None,
        steps=rep.records,
        trtllm_commands=commands,
        trtllm_configs={m.name: trtllm.tensorrtllm_config_pbtxt(m) for m in trt_models},
        notes=ctx.notes,
    )


def _check(opts: BuildOptions, rep: _Reporter) -> _Ctx:
    """Step 1: the pair fits together (and in memory), the options make sense, the tools are there."""
    say = rep.say("check")
    notes: list[str] = []
    device = resolve_device("auto") if opts.backend == "torch" else "cuda"
    opts, target, draft = _sides(opts, device, say, notes)
    compat = _compat(target, draft, say)
    max_context = min(compat.max_context, opts.max_context or compat.max_context)
    if opts.policy_file is not None:
        _validate_policy(opts.policy_file)
    trt_version = None
    if opts.backend == "trtllm":
        # Fail early, before anything is written; a dry run only prints.
        trt_version = trtllm.trtllm_version() if opts.dry_run else trtllm.require_trtllm()
    if draft is None and opts.drafter == "auto":
        notes.append("no draft model: requests drafted by auto draft with the policy's free drafter "
                     "(drafters.auto_free) alone")
    say("planning the memory pools")
    plan = _plan(opts, device, target, draft, max_context, notes)
    name = opts.name or _default_name(target.src)
    engine_dir = opts.engines_dir / name
    hashes = _Hashes()
    inputs = _inputs(opts, hashes, target, draft, max_context)
    inputs_sha256 = hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()
    prev = None if (opts.force or opts.dry_run) else _reusable(engine_dir / MANIFEST_FILE, engine_dir, inputs_sha256)
    return _Ctx(opts, rep, hashes, notes, target, draft, compat, max_context, plan, name, engine_dir,
                inputs, inputs_sha256, prev, trt_version, device)


def _sides(opts: BuildOptions, device: str, say: Callable[[str], None],
           notes: list[str]) -> tuple[BuildOptions, _Side, _Side | None]:
    """Target and draft (None without one) as the server will run them; ``opts`` with ``--draft-quant
    auto`` resolved."""
    t_dir = resolve_checkpoint(opts.target, say)
    t_cfg = read_config(t_dir)
    target = _side("target", t_dir, t_cfg, _target_precision(opts, t_cfg, t_dir, device))
    if opts.draft is None:
        return opts, target, None
    d_dir = resolve_checkpoint(opts.draft, say)
    d_cfg = read_config(d_dir)
    if opts.draft_quant == "auto":
        opts = replace(opts, draft_quant=_auto_draft_quant(opts.backend, d_cfg, device, notes))
    return opts, target, _side("draft", d_dir, d_cfg, _draft_precision(opts, d_cfg, d_dir, device, notes))


def _auto_draft_quant(backend: str, cfg: dict, device: str, notes: list[str]) -> str:
    """``--draft-quant auto``: int4 where the torch runtime serves the draft at int4 well
    (:func:`~trtspec.runtime.torch.loader.int4_draft_unfit`), else int8 (TensorRT-LLM: W8A16)."""
    if backend != "torch":
        return "int8"
    why = int4_draft_unfit(cfg, device)
    if why is not None:
        notes.append(f"--draft-quant auto: int8, not int4 ({why})")
        return "int8"
    return "int4"


def _side(role: str, src: Path, cfg: dict, precision: str) -> _Side:
    return _Side(role, src, cfg, (cfg.get("architectures") or ["unknown"])[0], precision)


def _compat(target: _Side, draft: _Side | None, say: Callable[[str], None]) -> CompatReport:
    """The draft can speculate for the target; without a draft, the target's own facts."""
    t_tok, t_vocab, t_ctx = Tokenizer.from_dir(target.src), int(target.cfg["vocab_size"]), _context_window(target.cfg)
    if draft is None:
        say("reading the target's tokenizer (no draft model to compare it with)")
        return target_facts(t_tok, t_vocab, t_ctx)
    say("comparing tokenizers, vocabularies and special tokens")
    return check_compatible(t_tok, Tokenizer.from_dir(draft.src), t_vocab, int(draft.cfg["vocab_size"]), t_ctx,
                            _context_window(draft.cfg))


def _context_window(cfg: dict) -> int:
    return int(cfg.get("max_position_embeddings", 2048))


def _plan(
    opts: BuildOptions, device: str, target: _Side, draft: _Side | None, max_context: int, notes: list[str]
) -> MemoryPlan:
    dev = _device_memory(opts, device)
    if opts.backend == "torch":
        t_fp = _torch_footprint(target, dev.kind)
        d_fp = _torch_footprint(draft, dev.kind) if draft is not None else None
    else:
        assert draft is not None  # validate(): a TensorRT-LLM build has a draft
        t_fp, d_fp = _trtllm_footprint(target, int8=False), _trtllm_footprint(draft, int8=opts.draft_quant == "int8")
        notes.append("TensorRT-LLM weight bytes are estimated from the checkpoints (bf16; W8A16 keeps "
                     "the embedding and LM head in 16 bits)")
    plan = plan_memory(dev, t_fp, d_fp, max_context, opts.max_sessions, opts.max_draft_len,
                       opts.headroom_fraction, TRTLLM_TOKENS_PER_BLOCK if opts.backend == "trtllm" else 1)
    notes += plan.notes
    return plan


def _inputs(opts: BuildOptions, hashes: _Hashes, target: _Side, draft: _Side | None, max_context: int) -> dict:
    """What shapes the engines: equal inputs, nothing to rebuild."""
    versions = Versions.current()
    return {
        "target": hashes.directory(target.src),
        "draft": hashes.directory(draft.src) if draft is not None else None,
        "backend": opts.backend,
        "draft_quant": opts.applied_draft_quant,
        "max_draft_len": opts.max_draft_len,
        "max_context": max_context,
        "max_sessions": opts.max_sessions,
        "probe": {**opts.probe.to_dict(),
                  "prompts": hashes.file(opts.probe.prompts_file) if opts.probe.prompts_file else "packaged"},
        "versions": {"trtspec": versions.trtspec, "torch": versions.torch, "tensorrt_llm": versions.tensorrt_llm},
    }


def _float_precision(device: str) -> str:
    return "fp32" if device == "cpu" else "bf16"  # the torch runtime's "auto"


def _target_precision(opts: BuildOptions, cfg: dict, src: Path, device: str) -> str:
    """What the server will run the target at."""
    if opts.backend == "trtllm":
        return trtllm.ENGINE_DTYPE
    return checkpoint_precision(cfg, src, device) or _float_precision(device)


def _draft_precision(opts: BuildOptions, cfg: dict, src: Path, device: str, notes: list[str]) -> str:
    """What the server will run the draft at."""
    if opts.draft_quant == "int4":
        if device != "cpu":
            raise BuildError(f"--draft-quant int4 runs on the CPU (torch's int4 CPU kernel); this build serves "
                             f"on {device}: use --draft-quant int8")
        return "int4"
    int8 = opts.draft_quant == "int8"
    if opts.backend == "trtllm":
        return "w8a16" if int8 else trtllm.ENGINE_DTYPE
    if not int8:
        return checkpoint_precision(cfg, src, device) or _float_precision(device)
    if device != "cpu":
        notes.append("the torch runtime runs int8 weights on CPU only; on CUDA the int8 draft is dequantized "
                     "to bf16 at load (use --backend trtllm for W8A16 on a GPU)")
        return "bf16"
    return "int8"


def _quantize(ctx: _Ctx) -> QuantReport | None:
    """Step 2: write the int8 or int4 draft (torch backend) and measure what quantization costs."""
    rep, opts = ctx.rep, ctx.opts
    quant = opts.applied_draft_quant
    if quant is None:
        rep.skip("quantize", "no draft model: nothing to quantize, no acceptance probe")
        return None
    if quant == "none":
        rep.skip("quantize", "--draft-quant none: the draft is used as it is")
        return None
    if ctx.prev is not None and ctx.prev.quantization.report is not None:
        rep.skip("quantize", f"inputs unchanged: reusing the {quant} draft and its measured figures")
        return QuantReport.from_dict(ctx.prev.quantization.report)
    with rep.step("quantize") as rec:
        say = rep.say("quantize")
        probe = replace(opts.probe, k=opts.max_draft_len)
        if ctx.draft_written and not opts.dry_run:
            say(f"writing the {quant} weight-only draft ({QUANT_SPECS[quant]['granularity']})")
            written = write_quantized_checkpoint(ctx.draft.src, ctx.engine_dir / "draft", quant)
            say(f"{written.quantized_matrices} matrices quantized; measuring what it cost")
            report = measure_quantization(ctx.target.src, ctx.draft.src, written.path, probe, say, precision=quant)
        else:
            # A dry run, or TensorRT-LLM, which quantizes at engine build (W8A16: the same per-channel
            # symmetric int8): the cost is measured with the torch runtime quantizing the same way in memory.
            report = measure_quantization(ctx.target.src, ctx.draft.src, None, probe, say, precision=quant)
        rec.detail = _quant_summary(report)
    return report


def _engine_specs(ctx: _Ctx) -> tuple[trtllm.EngineSpec, ...]:
    if ctx.opts.backend != "trtllm":
        return ()
    assert ctx.draft is not None  # validate(): a TensorRT-LLM build has a draft
    return trtllm.engine_specs(
        target_dir=ctx.target.src, draft_dir=ctx.draft.src, target_arch=ctx.target.arch, draft_arch=ctx.draft.arch,
        engine_root=ctx.engine_dir, work_dir=ctx.engine_dir / WORK_DIR, draft_int8=ctx.int8,
        max_draft_len=ctx.opts.max_draft_len, max_context=ctx.max_context, max_batch_size=ctx.opts.max_sessions,
    )


def _compile(ctx: _Ctx, specs: tuple[trtllm.EngineSpec, ...]) -> None:
    """Step 3: torch: the runtime's artefacts in engines/<name>/; TensorRT-LLM: the two engines."""
    rep, opts, engine_dir = ctx.rep, ctx.opts, ctx.engine_dir
    if ctx.prev is not None:
        rep.skip("compile", "inputs unchanged: engines are up to date")
        return
    with rep.step("compile") as rec:
        say = rep.say("compile")
        if opts.dry_run:
            rec.status = "dry-run"
            rec.detail = f"{2 * len(specs)} commands (not run)" if specs else "nothing written (dry run)"
        elif opts.backend == "torch":
            stale = ["tokenizer", WORK_DIR]  # left by an earlier TensorRT-LLM build of this name
            if ctx.draft is None:
                stale.append("draft")  # left by an earlier build with a draft
            for sub in stale:
                shutil.rmtree(engine_dir / sub, ignore_errors=True)
            say("copying the target's runtime artefacts")
            n = _sync_dir(_checkpoint_files(ctx.target.src), engine_dir / "target")
            if ctx.draft is not None and not ctx.draft_written:
                say("copying the draft's runtime artefacts")
                n += _sync_dir(_checkpoint_files(ctx.draft.src), engine_dir / "draft")
            rec.detail = f"torch runtime artefacts in {engine_dir} ({n} files copied)"
        else:
            for sub in ("target", "draft", "tokenizer", WORK_DIR):
                if (engine_dir / sub).exists():
                    shutil.rmtree(engine_dir / sub)
            trtllm.build_engines(specs, say)
            tok_dir = engine_dir / "tokenizer"
            tok_dir.mkdir(parents=True)
            shutil.copyfile(ctx.target.src / "config.json", tok_dir / "config.json")
            copy_side_files(ctx.target.src, tok_dir)
            shutil.rmtree(engine_dir / WORK_DIR, ignore_errors=True)
            rec.detail = f"TensorRT-LLM {ctx.trt_version} engines in {engine_dir}"


def _manifest(ctx: _Ctx, quant: QuantReport | None, commands: list[list[str]]) -> Manifest:
    """Step 5: engines/<name>/manifest.json, rewritten only when something in it changed."""
    opts, plan = ctx.opts, ctx.plan
    with ctx.rep.step("manifest") as rec:
        files = [] if opts.dry_run else hash_files(ctx.engine_dir, _engine_files(ctx.engine_dir))
        old = _previous_manifest(ctx.manifest_path)
        created = (old.created if old is not None and old.inputs_sha256 == ctx.inputs_sha256
                   else datetime.now(timezone.utc).replace(microsecond=0).isoformat())
        manifest = Manifest(
            name=ctx.name,
            backend=opts.backend,
            created=created,
            versions=Versions.current(),
            gpu=_gpu_info() if opts.backend == "trtllm" and not opts.dry_run else None,
            inputs_sha256=ctx.inputs_sha256,
            build_options=_build_options(ctx, commands),
            max_draft_len=opts.max_draft_len,
            vocab_size=ctx.compat.vocab_size,
            tokenizer_fingerprint=ctx.compat.tokenizer_fingerprint,
            quantization=Quantization(
                draft=_draft_scheme(ctx),
                report=quant.to_dict() if quant else None,
            ),
            models=_model_entries(ctx),
            memory_plan=plan.to_dict(),
            files=files,
        )
        if opts.dry_run:
            rec.status, rec.detail = "dry-run", "not written (dry run)"
        elif old is not None and old.same_build(manifest):
            rec.detail = f"{ctx.manifest_path} unchanged"
        else:
            ctx.engine_dir.mkdir(parents=True, exist_ok=True)
            manifest.write(ctx.manifest_path)
            rec.detail = f"{ctx.manifest_path} ({len(files)} files hashed)"
    return manifest


def _previous_manifest(path: Path) -> Manifest | None:
    """The manifest an earlier build left at ``path`` (None: none, or unreadable)."""
    if not path.is_file():
        return None
    try:
        return load_manifest(path)
    except TrtspecError:
        return None


def _model_entries(ctx: _Ctx) -> dict[str, ModelEntry]:
    opts, plan = ctx.opts, ctx.plan
    return {
        side.role: ModelEntry(
            role=side.role, source=str(given), source_sha256=ctx.inputs[side.role], path=side.role,
            architecture=side.arch, precision=side.precision, weight_bytes=share.weight_bytes,
            kv_bytes_per_token=share.kv_bytes_per_token, max_context=ctx.max_context,
        )
        for side, share, given in ((ctx.target, plan.target, opts.target), (ctx.draft, plan.draft, opts.draft))
        if side is not None and share is not None
    }


def _build_options(ctx: _Ctx, commands: list[list[str]]) -> dict:
    """What the manifest records of the options (``draft_quant`` as resolved)."""
    opts = ctx.opts
    build_options = {
        "backend": opts.backend,
        "draft_quant": opts.applied_draft_quant,
        "default_drafter": opts.drafter,
        "max_draft_len": opts.max_draft_len,
        "max_context": ctx.max_context,
        "max_sessions": opts.max_sessions,
        "max_tokens_limit": opts.max_tokens_limit,
        "headroom_fraction": opts.headroom_fraction,
        "device_memory_bytes": opts.device_memory_bytes,
        "probe": opts.probe.to_dict(),
        "policy": ({"path": str(opts.policy_file), "sha256": ctx.hashes.file(opts.policy_file)}
                   if opts.policy_file else None),
    }
    if opts.backend == "trtllm":
        build_options["trtllm_commands"] = [_portable(c) for c in commands]
    return build_options


def _draft_scheme(ctx: _Ctx) -> dict | None:
    """The draft's quantization as the manifest records it; None without a draft model."""
    if ctx.draft is None:
        return None
    quant = ctx.opts.applied_draft_quant
    return dict(QUANT_SPECS[quant]) if quant in QUANT_SPECS else {"method": "none"}


def _trtllm_models(ctx: _Ctx) -> list[trtllm.TrtllmModelConfig]:
    if ctx.opts.backend != "trtllm":
        return []
    return [
        trtllm.TrtllmModelConfig(
            name=share.role,
            engine_dir=(ctx.engine_dir / share.role).resolve(),
            max_batch_size=ctx.opts.max_sessions,
            max_seq_len=ctx.max_context,
            kv_cache_free_gpu_mem_fraction=share.kv_cache_free_gpu_mem_fraction,
            max_tokens_in_paged_kv_cache=share.max_tokens_in_paged_kv_cache,
        )
        for share in ctx.plan.shares
    ]


def _model_repo(ctx: _Ctx, trt_models: list[trtllm.TrtllmModelConfig]) -> None:
    """Step 6: the Triton model repository (the torch backend's is written by :mod:`trtspec.builder.repo`)."""
    opts, rep = ctx.opts, ctx.rep
    if opts.model_repo is None:
        rep.skip("model_repo", "no --model-repo given")
        return
    with rep.step("model_repo") as rec:
        if opts.dry_run:
            rec.status, rec.detail = "dry-run", "not written (dry run)"
            return
        repo = opts.model_repo
        for m in trt_models:
            trtllm.write_trtllm_model(repo, m)
        if opts.backend == "trtllm":
            rep.info("model_repo", "writing spec_decode for the TensorRT-LLM engines")
            tok_dir = (ctx.engine_dir / "tokenizer").resolve()  # the target's config + tokenizer (step 3)
            write_model_repo(
                repo,
                target_checkpoint=tok_dir,
                draft_checkpoint=ctx.draft.src,  # read for its vocabulary and context only
                tokenizer_dir=tok_dir,
                max_tokens_limit=opts.max_tokens_limit,
                max_context=ctx.max_context,
                draft_length=opts.max_draft_len,
                default_drafter=opts.drafter,
                policy_file=opts.policy_file.resolve() if opts.policy_file else None,
                manifest_file=ctx.manifest_path.resolve(),
                model_backend="tensorrtllm",
                model_name=opts.model_name,
            )
            rec.detail = f"spec_decode + tensorrtllm configs for target and draft in {repo}"
            return
        models = ", ".join([opts.model_name, *(s.role for s in ctx.plan.shares)])
        rep.info("model_repo", f"writing {models}")
        write_model_repo(
            repo,
            target_checkpoint=(ctx.engine_dir / "target").resolve(),
            draft_checkpoint=(ctx.engine_dir / "draft").resolve() if ctx.draft else None,
            target_precision=ctx.target.precision,
            draft_precision=ctx.draft.precision if ctx.draft else "auto",
            tokenizer_dir=(ctx.engine_dir / "target").resolve(),
            max_tokens_limit=opts.max_tokens_limit,
            max_context=ctx.max_context,
            max_sessions=ctx.plan.sessions,
            draft_length=opts.max_draft_len,
            default_drafter=opts.drafter,
            device=ctx.device,
            policy_file=opts.policy_file.resolve() if opts.policy_file else None,
            manifest_file=ctx.manifest_path.resolve(),
            model_name=opts.model_name,
        )
        rec.detail = f"{models} in {repo}; default drafter {opts.drafter}"


def _quant_summary(q: QuantReport) -> str:
    s = f"weights {q.weight_bytes_before / (1 << 20):.1f} -> {q.weight_bytes_after / (1 << 20):.1f} MiB"
    if q.acceptance_before and q.acceptance_after:
        b, a = q.acceptance_before.acceptance_rate, q.acceptance_after.acceptance_rate
        if b is not None and a is not None:
            s += f"; acceptance {b:.1%} -> {a:.1%}"
    return s


def _portable(cmd: list[str]) -> list[str]:
    """A command as recorded in the manifest: this interpreter's path replaced by ``python``."""
    return ["python" if i == 0 and c == sys.executable else c for i, c in enumerate(cmd)]


def _device_memory(opts: BuildOptions, device: str) -> DeviceMemory:
    kind = "cpu" if device == "cpu" else "gpu"
    if opts.device_memory_bytes is not None:
        return device_override(opts.device_memory_bytes, kind)
    if kind == "gpu":
        try:
            import torch

            has_gpu = torch.cuda.is_available()
        except Exception:  # a broken CUDA install reads as no GPU
            has_gpu = False
        if not has_gpu:
            raise BuildError("planning the TensorRT-LLM memory pools needs the GPU's size: run on the GPU host "
                             "or pass --device-memory (e.g. 80GiB)")
        return read_device_memory("cuda", env_device_index())
    return read_device_memory("cpu")


def _torch_footprint(side: _Side, kind: str) -> ModelFootprint:
    device = "cpu" if kind == "cpu" else "cuda"
    kv_dtype = kv_cache_dtype(side.cfg, side.precision, device)
    packed = weights_packed(side.cfg, side.precision, device)
    return ModelFootprint(
        role=side.role,
        weight_bytes=runtime_weight_bytes(side.src, side.cfg, side.precision, packed=packed)
        + argmax_head_bytes(side.cfg, side.precision, device, checkpoint_head_tied(side.src, side.cfg)),
        kv_bytes_per_token=kv_bytes_per_token(side.cfg, kv_dtype.itemsize),
        overhead_bytes=DEFAULT_OVERHEAD_BYTES[kind],
    )


def _trtllm_footprint(side: _Side, int8: bool) -> ModelFootprint:
    weights = (runtime_weight_bytes(side.src, side.cfg, "int8", int8_exclude=("embed_tokens", "lm_head"))
               if int8 else runtime_weight_bytes(side.src, side.cfg, "bf16"))
    return ModelFootprint(
        role=side.role,
        weight_bytes=weights,
        kv_bytes_per_token=kv_bytes_per_token(side.cfg, 2),
        overhead_bytes=DEFAULT_OVERHEAD_BYTES["gpu"],
    )
