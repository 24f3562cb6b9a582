"""``trtspec demo``: the whole path on the embedded demo pair, in one command.

build (the draft INT4 where it runs well, else INT8: ``--draft-quant``; manifest, memory plan, model repository) -> serve (a real
tritonserver) -> a few requests with speculation auto and off -> text and stats
-> shut down.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from trtspec.cli.build import DraftQuant
from trtspec.cli.common import JsonOpt, check_output_dir, domain_errors, log, print_json

DEMO_PROMPTS = (
    "Explain how photosynthesis works.",
    "Write a short poem about the sea.",
    "What are three tips for learning a new language?",
)


def demo(
    out: Annotated[Path, typer.Option("--out", help="Where engines/ and model_repo/ are written.")] = Path("."),
    max_tokens: Annotated[int, typer.Option("--max-tokens", "-n", help="New tokens per request.")] = 64,
    prompts: Annotated[int, typer.Option("--prompts", help=f"How many demo prompts (1..{len(DEMO_PROMPTS)}).")] = 2,
    draft_quant: Annotated[DraftQuant, typer.Option(
        "--draft-quant", help="auto: int4 on a CPU with AVX2/AVX-512, else int8; int8: the INT8 draft; int4: INT4 layers (CPU; the GGUF's Q4_1 as it is); none: float.")] = DraftQuant.auto,
    json_out: JsonOpt = False,
) -> None:
    """Build the demo pair, serve it on a real tritonserver, send requests, print text and stats, stop."""
    from trtspec.builder.pipeline import BuildOptions, run_build
    from trtspec.runtime.demo import prepare_demo
    from trtspec.serving.client import GenerateParams, generate
    from trtspec.serving.launcher import TritonServer, find_tritonserver

    say = lambda m: log(m, quiet=json_out)  # noqa: E731
    check_output_dir(out, "--out")  # before the pair is prepared and built
    runs = []
    with domain_errors():
        pair = prepare_demo(progress=lambda m: say(f"[demo] {m}"))
        say(f"[build] checking, quantizing the draft ({draft_quant.value}), planning memory, writing the model repository")
        result = run_build(
            BuildOptions(
                target=pair.target,
                draft=pair.target,  # the build makes the quantized draft from the target
                draft_quant=draft_quant.value,
                name="demo",
                engines_dir=out / "engines",
                model_repo=out / "model_repo",
            )
        )
        say(f"[build] {result.model_repo} (engines in {result.engine_dir}; the draft "
            f"{result.manifest.build_options['draft_quant']})")
        install = find_tritonserver()
        log_file = out / "tritonserver.log"
        say(f"[serve] starting {install.executable}; log: {log_file}")
        with TritonServer(Path(result.model_repo), log_file=log_file, install=install) as server:
            assert server.endpoints is not None
            url = server.endpoints.grpc
            say(f"[serve] ready: gRPC {url}, HTTP {server.endpoints.http}, metrics {server.endpoints.metrics_url}")
            for text in DEMO_PROMPTS[: max(1, min(prompts, len(DEMO_PROMPTS)))]:
                for speculation in ("off", "auto"):
                    r = generate(url, text, GenerateParams(max_tokens=max_tokens, speculation=speculation))
                    runs.append({"prompt": text, "speculation": speculation, **r.to_dict()})
                    if not json_out:
                        rate = f"{r.acceptance_rate:.0%}" if r.acceptance_rate is not None else "n/a"
                        typer.echo(f"\n>>> {text}  [speculation {speculation}]\n{r.text}")
                        say(
                            f"[stats] {r.num_output_tokens} tokens in {r.total_s:.2f}s ({r.tokens_per_s:.1f} tok/s), "
                            f"drafted {r.num_draft_tokens}, accepted {r.num_accepted_tokens} ({rate})"
                        )
        say("[serve] stopped")
    speedups = _speedups(runs)
    if json_out:
        print_json({"build": result.to_dict(), "requests": runs, "speedups": speedups})
    else:
        say(f"[summary] speculation auto vs off, tokens/s: {', '.join(f'{x:.2f}x' for x in speedups)} "
            f"(the draft {result.manifest.build_options['draft_quant']})")


def _speedups(runs: list[dict]) -> list[float]:
    """Per prompt, tokens/s with speculation ``auto`` over ``off`` (the runs come in off/auto pairs)."""
    return [round(auto["tokens_per_s"] / off["tokens_per_s"], 3) for off, auto in zip(runs[::2], runs[1::2], strict=True)
            if off["tokens_per_s"]]
