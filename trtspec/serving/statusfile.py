"""Status files: how the served models tell ``trtspec serve`` (and tests) what they are doing.

The launcher gives the server (and so every Python stub it starts) the
environment variable ``TRTSPEC_STATUS_DIR``; each trtspec model writes
``<dir>/<model name>.json`` there, atomically (write, then rename), with an
``updated_at`` (Unix time) so a reader can tell a stale file: ``spec_decode``
every second (supervisor states, breaker, speculation on/off), ``draft`` and
``target`` whenever their number of KV-cache sessions changes (and at most a
second apart while they serve). Without the variable nothing is written.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

ENV = "TRTSPEC_STATUS_DIR"


def status_dir() -> Path | None:
    d = os.environ.get(ENV, "")
    return Path(d) if d else None


def status_path(model: str) -> Path | None:
    d = status_dir()
    return d / f"{model}.json" if d is not None else None


def write_status(path: Path, data: dict[str, Any]) -> None:
    """Write ``data`` (plus ``updated_at`` and ``pid``) to ``path`` atomically; never raises."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps({**data, "updated_at": time.time(), "pid": os.getpid()}, default=str))
        tmp.replace(path)
    except Exception:  # a status file must never fail a request
        pass


def read_status(path: Path) -> dict | None:
    """The file's content with ``age_s`` added; None if missing or unreadable."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if isinstance(data, dict) and isinstance(data.get("updated_at"), (int, float)):
        data["age_s"] = max(0.0, time.time() - data["updated_at"])
    return data if isinstance(data, dict) else None
