"""``trtspec plan``: expected speedup, ROI and a recommended policy from request logs and bench results."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from trtspec.cli.common import JsonOpt, check_output_dir, domain_errors, err_console, fail, log, print_json


def plan(
    logfile: Annotated[Path, typer.Argument(help="Request log: JSONL or CSV with prompt_tokens, output_tokens, timestamp[, priority].")],
    bench: Annotated[list[Path] | None, typer.Option("--bench", help="A bench results.json (repeat for several rates: the load correction; runs of several --drafter values are compared).")] = None,
    alpha: Annotated[float | None, typer.Option("--alpha", help="Per-token acceptance probability (Leviathan's alpha); overrides bench.")] = None,
    c: Annotated[float | None, typer.Option("--c", help="Cost of a draft step in target steps; overrides bench.")] = None,
    k: Annotated[int | None, typer.Option("--k", help="Drafted tokens per iteration (default: measured by bench, else 5).")] = None,
    gpu_price: Annotated[float | None, typer.Option("--gpu-price", help="Price of one GPU-hour (ROI in money).")] = None,
    tokens_per_s: Annotated[float | None, typer.Option("--tokens-per-s", help="Output tokens/s one GPU generates without speculation (default: from bench).")] = None,
    rate_per_gpu: Annotated[float | None, typer.Option("--rate-per-gpu", help="Requests/s one server sees, for the load correction (default: logged rate / GPUs needed).")] = None,
    policy: Annotated[Path | None, typer.Option("--policy", help="The policy deployed now (default: the built-in defaults).")] = None,
    threshold: Annotated[int | None, typer.Option("--threshold", help="The current speculation threshold in context tokens (default: the policy's).")] = None,
    min_gain: Annotated[float, typer.Option("--min-gain", help="A bucket pays when its expected speedup is at least 1 + this.")] = 0.05,
    skip_bad_rows: Annotated[bool, typer.Option("--skip-bad-rows", help="Plan without bad log rows (they are listed) instead of failing.")] = False,
    out: Annotated[Path, typer.Option("--out", help="Directory for plan.json, policy files, PNGs, plan.md/.html.")] = Path("plan-results"),
    json_out: JsonOpt = False,
) -> None:
    """Plan speculation from request logs: speedup by length, ROI, a recommended policy."""
    from trtspec.plan import LogParseError, PlanConfig, plan_by_drafter, plan_json, read_log, resolve_inputs, text_summary, write_plan

    cfg = PlanConfig(alpha=alpha, c=c, k=k, gpu_price=gpu_price, tokens_per_s=tokens_per_s, rate_per_gpu=rate_per_gpu,
                     threshold=threshold, min_gain=min_gain)
    with domain_errors():  # a log that cannot be read: one line
        try:
            request_log = read_log(logfile, skip_bad_rows=skip_bad_rows)
        except LogParseError as e:  # bad rows: each listed, then one line
            for p in e.problems:
                err_console.print(f"{e.path}:{p.line}: {p.message}", soft_wrap=True, markup=False, highlight=False)
            fail(str(e).split(": ", 1)[0] + f": {len(e.problems)} bad row(s) (listed above); fix them or pass --skip-bad-rows")
    check_output_dir(out, "--out")
    with domain_errors():
        if policy is not None:
            from trtspec.control import load_policy

            cfg.current_policy = load_policy(policy)
        inputs = resolve_inputs(bench or [], cfg)
        result = plan_by_drafter(request_log, inputs, cfg)
        files = write_plan(result, request_log, out)
    for p in request_log.problems:
        log(f"skipped {request_log.path}:{p.line}: {p.message}", quiet=json_out)
    if json_out:
        print_json(plan_json(result, {k: v for k, v in files.items() if k.startswith("policy_")}) | {"files": files})
    else:
        typer.echo(text_summary(result))
        for kind, path in files.items():
            log(f"{kind:<20}{path}")
