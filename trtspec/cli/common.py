"""Options and helpers shared by every command group.

Conventions: results go to stdout (one JSON object with ``--json``), logs and
progress to stderr, and progress is off under ``--json``. A domain error
(:class:`~trtspec.errors.TrtspecError`) becomes one ``error: ...`` line on
stderr and exit code 1.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from rich.console import Console
from rich.markup import escape

from trtspec.errors import TrtspecError

JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON object to stdout; no progress display.")]

err_console = Console(stderr=True, highlight=False)


def fail(message: str, code: int = 1) -> NoReturn:
    """Print ``error: message`` (one line) to stderr and exit."""
    err_console.print(f"[bold red]error:[/] {escape(message)}", soft_wrap=True)
    raise typer.Exit(code)


@contextmanager
def domain_errors() -> Iterator[None]:
    """Turn library errors, and a file or directory that cannot be read or written, into one-line CLI errors."""
    try:
        yield
    except TrtspecError as e:
        fail(str(e))
    except OSError as e:
        if e.filename is None:
            raise
        fail(f"{e.filename}: {e.strerror or e}")


def check_output_dir(path: Path, option: str) -> None:
    """Fail now, in one line naming ``option``, when ``path`` could not be created or written: a long run
    must not end unable to write what it made. Nothing is created here."""
    existing = path.absolute()
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        fail(f"{option} {path}: {existing} is not a directory")
    if not os.access(existing, os.W_OK | os.X_OK):
        fail(f"{option} {path}: {existing} is not writable")


def print_json(obj: Any) -> None:
    sys.stdout.write(json.dumps(obj, indent=2, default=str) + "\n")
    sys.stdout.flush()


def log(message: str, quiet: bool = False) -> None:
    """A progress/log line on stderr (silenced with ``quiet``, e.g. under ``--json``); printed as is, no markup."""
    if not quiet:
        err_console.print(escape(message), soft_wrap=True)
