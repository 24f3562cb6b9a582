"""``trtspec policy``: show the effective speculation policy, check a policy file."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, NoReturn

import typer
from rich.markup import escape

from trtspec.cli.common import JsonOpt, err_console, print_json
from trtspec.control.config import Policy, dump_policy, load_policy
from trtspec.control.errors import PolicyError

app = typer.Typer(
    help="Inspect and validate speculation policy files (routing, draft length, breaker, admission, rollout).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

FileOpt = Annotated[
    Path | None,
    typer.Option("--file", "-f", help="Policy file (YAML, or TOML by its .toml suffix); omitted: the defaults."),
]


@app.command("show")
def show(file: FileOpt = None, json_out: JsonOpt = False) -> None:
    """Print the effective policy: FILE (if given) with every default merged in."""
    try:
        policy = load_policy(file) if file is not None else Policy()
    except PolicyError as e:
        _report(e, file, json_out)
    if json_out:
        print_json(policy.to_dict())
    else:
        sys.stdout.write(dump_policy(policy))


@app.command("check")
def check(
    file: Annotated[Path, typer.Argument(help="Policy file to validate.")],
    json_out: JsonOpt = False,
) -> None:
    """Validate FILE; print each problem on its own line (field path: what is allowed)."""
    try:
        policy = load_policy(file)
    except PolicyError as e:
        _report(e, file, json_out)
    if json_out:
        print_json({"file": str(file), "valid": True, "policy": policy.to_dict()})
    else:
        dl = policy.draft_length
        sys.stdout.write(
            f"ok: {file} is a valid policy (rollout {policy.rollout.mode.value}, "
            f"controller {dl.controller.value}, k_max {dl.k_max}, "
            f"breaker {'on' if policy.breaker.enabled else 'off'}, "
            f"fallback {'on' if policy.fallback.enabled else 'off'})\n"
        )


def _report(e: PolicyError, file: Path | None, json_out: bool) -> NoReturn:
    """Print every problem (one ``error:`` line each on stderr, or one JSON object on stdout); exit 1."""
    if json_out:
        print_json(
            {
                "file": str(file),
                "valid": False,
                "errors": [{"path": p.path, "message": p.message} for p in e.problems],
            }
        )
    else:
        for p in e.problems:
            err_console.print(f"[bold red]error:[/] {escape(f'{file}: {p}')}", soft_wrap=True)
    raise typer.Exit(1)
