"""``trtspec models``: prepare and inspect model checkpoints."""

from __future__ import annotations

import typer

from trtspec.cli.common import JsonOpt, domain_errors, log, print_json

app = typer.Typer(help="Prepare and inspect model checkpoints.", no_args_is_help=True)


@app.command("demo")
def demo(
    json_out: JsonOpt = False,
    force: bool = typer.Option(False, "--force", help="Rebuild even if cached."),
) -> None:
    """Prepare the embedded demo pair (SmolLM2-135M-Instruct + its INT8 copy), once.

    Cached under ~/.cache/trtspec/demo (or $TRTSPEC_CACHE/demo).
    """
    from trtspec.runtime.demo import prepare_demo

    with domain_errors():
        pair = prepare_demo(progress=lambda m: log(f"[demo] {m}", quiet=json_out), force=force)
    if json_out:
        print_json(pair.to_dict())
    else:
        typer.echo(f"target: {pair.target}")
        typer.echo(f"draft:  {pair.draft}")
