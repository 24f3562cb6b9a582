"""Where trtspec keeps things on disk."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path


def cache_dir() -> Path:
    """``$TRTSPEC_CACHE``, else ``~/.cache/trtspec`` (downloaded and converted models)."""
    env = os.environ.get("TRTSPEC_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "trtspec"


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file, read in 1 MiB blocks."""
    h = hashlib.sha256()
    with Path(path).open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()
