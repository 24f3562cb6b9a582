"""``trtspec status``: does the deployment actually answer, and is speculation on?"""

from __future__ import annotations

from typing import Annotated

import typer

from trtspec.cli.common import JsonOpt, domain_errors, print_json

NOT_READY_EXIT = 2


def status(
    url: Annotated[str, typer.Option("--url", help="Status endpoint of `trtspec serve`: HOST:PORT (its --status-port, 8003 by default).")],
    timeout: Annotated[float, typer.Option("--timeout", help="Seconds to wait for the answer (the server probes every model).")] = 30.0,
    json_out: JsonOpt = False,
) -> None:
    """Print whether spec_decode, target and draft actually answer, the breaker state and whether speculation is on.

    Exit code 0 when ready (spec_decode and target answer), 2 when the server answers but is not ready,
    1 when the status endpoint cannot be reached.
    """
    from trtspec.serving.status import fetch_status, format_status

    with domain_errors():
        st = fetch_status(url, timeout_s=timeout)
    if json_out:
        print_json(st)
    else:
        for line in format_status(st):
            typer.echo(line)
    if not st.get("ready"):
        raise typer.Exit(NOT_READY_EXIT)
