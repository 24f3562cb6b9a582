"""The ``trtspec`` command: one module per command group, joined here."""

from __future__ import annotations

import typer

from trtspec import __version__
from trtspec.cli import bench, build, demo, generate, models, monitoring, plan, policy, serve, status, trace

app = typer.Typer(
    name="trtspec",
    help="Speculative decoding on Triton Inference Server, safely.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
app.add_typer(models.app, name="models")
app.add_typer(policy.app, name="policy")
app.add_typer(monitoring.app, name="monitoring")
app.add_typer(trace.app, name="trace")
app.command("demo")(demo.demo)
app.command("generate")(generate.generate)
app.command("build")(build.build)
app.command("serve")(serve.serve)
app.command("bench")(bench.bench)
app.command("plan")(plan.plan)
app.command("status")(status.status)


@app.command("version")
def version() -> None:
    """Print the trtspec version."""
    typer.echo(__version__)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
