"""Where trtspec keeps things on disk."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """``$TRTSPEC_CACHE``, else ``~/.cache/trtspec`` (downloaded and converted models)."""
    env = os.environ.get("TRTSPEC_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "trtspec"
