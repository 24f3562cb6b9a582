"""``trtspec build``: engines, manifest and model repository for a draft/target pair, or for a
target alone (served with the free drafters: n-gram and suffix lookups, no draft model)."""

from __future__ import annotations

import enum
import shlex
from pathlib import Path
from typing import Annotated

import typer

from trtspec.cli.common import JsonOpt, check_output_dir, domain_errors, err_console, fail, log, print_json
from trtspec.decoding.types import DrafterKind
from trtspec.wire import SPEC_DECODE, SpecDecodeParams


class Backend(str, enum.Enum):
    torch = "torch"
    trtllm = "trtllm"


class DraftQuant(str, enum.Enum):
    auto = "auto"
    int8 = "int8"
    int4 = "int4"
    none = "none"


def build(
    target: Annotated[Path | None, typer.Option("--target", help="Target checkpoint: HF dir or .gguf.")] = None,
    draft: Annotated[Path | None, typer.Option(
        "--draft", help="Draft checkpoint: HF dir or .gguf. Without one the target is served alone, drafting with n-gram/suffix lookups.")] = None,
    demo: Annotated[bool, typer.Option(
        "--demo", help="SmolLM2-135M-Instruct as target, and as draft its quantized copy (--draft-quant) made by this build.")] = False,
    backend: Annotated[Backend, typer.Option("--backend", help="torch: the torch runtime; trtllm: TensorRT-LLM engines.")] = Backend.torch,
    draft_quant: Annotated[DraftQuant, typer.Option("--draft-quant", help="auto: int4 where the torch runtime serves the draft on a CPU with AVX2/AVX-512 and its shapes fit, else int8; int8: weight-only INT8; int4: INT4 layers, INT8 embedding and head (torch runtime, CPU); none: as is.")] = DraftQuant.auto,
    max_draft_len: Annotated[int, typer.Option("--max-draft-len", help="Most draft tokens per iteration (any drafter).")] = SpecDecodeParams.draft_length,
    default_drafter: Annotated[DrafterKind | None, typer.Option(
        "--default-drafter", help="What drafts for requests that name no drafter (default: model with --draft, ngram without).")] = None,
    policy: Annotated[Path | None, typer.Option("--policy", help="Control-plane policy file for the served models.")] = None,
    engines: Annotated[Path, typer.Option("--engines", help="Where engines/<name>/ go.")] = Path("engines"),
    model_repo: Annotated[Path, typer.Option("--model-repo", help="Triton model repository to write.")] = Path("model_repo"),
    model_name: Annotated[str, typer.Option("--model-name", help="Name the orchestrator is served under (e.g. ensemble, tensorrt_llm_bls: the name existing clients call).")] = SPEC_DECODE,
    name: Annotated[str | None, typer.Option("--name", help="Engine name (default: the target dir's name; 'demo').")] = None,
    max_context: Annotated[int | None, typer.Option("--max-context", help="Tokens per sequence (default: what both models allow).")] = None,
    max_sessions: Annotated[int, typer.Option("--max-sessions", help="Concurrent sequences to size the KV pools for.")] = 8,
    max_tokens_limit: Annotated[int, typer.Option("--max-tokens-limit", help="Most new tokens one request may ask for.")] = SpecDecodeParams.max_tokens_limit,
    probe_prompts: Annotated[int, typer.Option("--probe-prompts", help="Prompts for the acceptance probe (0 skips it).")] = 4,
    probe_tokens: Annotated[int, typer.Option("--probe-tokens", help="New tokens per probe prompt.")] = 32,
    device_memory: Annotated[str | None, typer.Option(
        "--device-memory", help="Plan for a device of this size (e.g. 80GiB) instead of this host's.")] = None,
    headroom: Annotated[float, typer.Option("--headroom", help="Fraction of device memory left unplanned.")] = 0.10,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Check, measure and plan; write nothing, print the commands.")] = False,
    force: Annotated[bool, typer.Option("--force", help="Rebuild even when the inputs are unchanged.")] = False,
    json_out: JsonOpt = False,
) -> None:
    """Check, quantize, compile, plan memory, and write the manifest and the model repository."""
    from trtspec.builder.memory import parse_bytes
    from trtspec.builder.pipeline import BuildOptions, run_build
    from trtspec.builder.quantize import ProbeSettings

    if demo:
        if target or draft:
            fail("--demo and --target/--draft are mutually exclusive")
        from trtspec.runtime.demo import prepare_demo

        with domain_errors():
            pair = prepare_demo(progress=lambda m: log(f"[demo] {m}", quiet=json_out))
        # The demo's draft is the target itself, quantized by this build (prepare_demo's own int8 copy is
        # the same numbers as INT8); the before/after figures then show exactly what quantization costs.
        target, draft = pair.target, pair.target
        name = name or "demo"
    if target is None:
        fail("--target is required (or pass --demo)")
    with domain_errors():
        opts = BuildOptions(
            target=target,
            draft=draft,
            name=name,
            engines_dir=engines,
            model_repo=model_repo,
            model_name=model_name,
            backend=backend.value,
            draft_quant=draft_quant.value,
            max_draft_len=max_draft_len,
            default_drafter=default_drafter.value if default_drafter else None,
            policy_file=policy,
            max_context=max_context,
            max_sessions=max_sessions,
            max_tokens_limit=max_tokens_limit,
            probe=ProbeSettings(num_prompts=probe_prompts, max_new_tokens=probe_tokens, k=max_draft_len),
            headroom_fraction=headroom,
            device_memory_bytes=parse_bytes(device_memory) if device_memory else None,
            dry_run=dry_run,
            force=force,
        )
        if not dry_run:  # before the steps, not at the end of them
            check_output_dir(engines, "--engines")
            check_output_dir(model_repo, "--model-repo")
        if json_out:
            result = run_build(opts)
        else:
            with _StepDisplay() as display:
                result = run_build(opts, display.on_event)
    if json_out:
        print_json(result.to_dict())
    else:
        _print_summary(result)


class _StepDisplay:
    """Rich progress on stderr: one line per build step."""

    def __init__(self) -> None:
        from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

        self._progress = Progress(
            SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(), console=err_console, transient=False
        )
        self._tasks: dict[str, int] = {}
        self._titles: dict[str, str] = {}

    def __enter__(self) -> _StepDisplay:
        self._progress.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._progress.__exit__(*exc)  # type: ignore[arg-type]

    def on_event(self, event) -> None:  # event: trtspec.builder.pipeline.StepEvent
        from rich.markup import escape

        p = self._progress
        msg = escape(event.message)
        if event.status == "start":
            self._titles[event.step] = msg
            self._tasks[event.step] = p.add_task(msg, total=1)
            return
        task, title = self._tasks[event.step], self._titles[event.step]
        if event.status == "info":
            p.update(task, description=f"{title}: [dim]{msg}[/]")
        elif event.status == "done":
            p.update(task, description=f"[green]✓[/] {title}" + (f": {msg}" if msg else ""), completed=1)
        else:  # skipped
            p.update(task, description=f"[yellow]-[/] {title}: [dim]{msg}[/]", completed=1)


def _mib(n: int) -> str:
    return f"{n / (1 << 20):,.1f} MiB"


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.1%}"


def _print_summary(r) -> None:  # r: trtspec.builder.pipeline.BuildResult
    out = []
    state = " (dry run: nothing written)" if r.dry_run else (" (unchanged inputs: reused)" if r.reused else "")
    out.append(f"build {r.name!r}, backend {r.backend}{state}")
    out.append(f"  engines:     {r.engine_dir}   manifest: {r.manifest_path}")
    if r.model_repo:
        out.append(f"  model repo:  {r.model_repo}")
    out.append(f"  vocabulary:  {r.compat.vocab_size} tokens, tokenizer {r.compat.tokenizer_fingerprint}")
    out.append(f"  drafting:    {'a draft model' if r.has_draft else 'no draft model'}; "
               f"requests that name no drafter draft with {r.default_drafter}")
    q = r.quantization
    if q is not None:
        out.append(f"  draft {q.precision_after.upper()}:  weights {_mib(q.weight_bytes_before)} ({q.precision_before}) -> "
                   f"{_mib(q.weight_bytes_after)} ({q.precision_after}), {q.weight_ratio:.1%} of before")
        if q.acceptance_before and q.acceptance_after:
            b, a = q.acceptance_before, q.acceptance_after
            out.append(f"               greedy acceptance {_pct(b.acceptance_rate)} -> {_pct(a.acceptance_rate)}, "
                       f"tokens per iteration {b.mean_acceptance_length or 0:.2f} -> {a.mean_acceptance_length or 0:.2f} "
                       f"(k={q.probe['k']}, {b.prompts} prompts x {q.probe['max_new_tokens']} tokens)")
    m = r.memory_plan
    out.append(f"  memory plan: {m.device.name} {m.device.total_bytes / (1 << 30):.2f} GiB, "
               f"headroom {m.headroom_fraction:.0%}, {m.sessions} sessions x {m.tokens_per_sequence} tokens")
    for s in m.shares:
        line = (f"    {s.role:<7} weights {_mib(s.weight_bytes)}, KV {_mib(s.kv_bytes)} "
                f"({s.kv_tokens} tokens x {s.kv_bytes_per_token} B), overhead {_mib(s.overhead_bytes)}")
        if r.backend == "trtllm":
            line += (f"; kv_cache_free_gpu_mem_fraction {s.kv_cache_free_gpu_mem_fraction:.2f}, "
                     f"max_tokens_in_paged_kv_cache {s.max_tokens_in_paged_kv_cache}")
        out.append(line)
    if r.backend == "trtllm" and r.dry_run:
        out.append("  commands:")
        out += [f"    {shlex.join(c)}" for c in r.trtllm_commands]
        for model, text in r.trtllm_configs.items():
            out.append(f"  {r.model_repo or 'model_repo'}/{model}/config.pbtxt:")
            out += [f"    {line}" for line in text.splitlines()]
    for note in r.notes:
        out.append(f"  note: {note}")
    typer.echo("\n".join(out))
