"""``trtspec trace``: read rejection traces (the JSONL files the serving model samples).

    trtspec trace summarize rejections.jsonl [rejections.jsonl.1 ...] [--top 10] [--json]
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from trtspec.cli.common import JsonOpt, fail, print_json
from trtspec.obs.trace import format_summary, summarize as summarize_trace

app = typer.Typer(
    help="Read rejection traces: where and on what the draft gets rejected.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.callback()
def _group() -> None:
    """Read rejection traces: where and on what the draft gets rejected."""


@app.command("summarize")
def summarize(
    files: Annotated[list[Path], typer.Argument(help="Trace files (JSONL); rotated ones (FILE.1, ...) too.")],
    top: Annotated[int, typer.Option("--top", help="How many most-rejected tokens to list.")] = 10,
    json_out: JsonOpt = False,
) -> None:
    """Rejections by first rejected position, by sequence length, by hour of day, and the most-rejected tokens."""
    missing = [str(f) for f in files if not f.is_file()]
    if missing:
        fail(f"trace file not found: {', '.join(missing)}")
    if top < 0:
        fail(f"--top must be >= 0, got {top}")
    try:
        summary = summarize_trace(files, top=top)
    except (OSError, UnicodeDecodeError) as e:
        fail(f"cannot read the trace: {e}")
    if json_out:
        print_json({"files": [str(f) for f in files], **summary.to_dict()})
    else:
        sys.stdout.write(format_summary(summary))
