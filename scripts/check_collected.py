"""Fail when pytest would not collect every ``tests/**/test_*.py`` file.

pytest skips folders matched by ``norecursedirs`` (its default holds ``build``)
and files it cannot import, silently; CI once ran none of ``tests/build/`` for
that reason. Run from the repository root with the project's venv active.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def main() -> int:
    on_disk = {p.as_posix() for p in Path("tests").rglob("test_*.py")}
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "tests"],
        capture_output=True, text=True, check=False,
    ).stdout
    collected = {line.split("::", 1)[0] for line in out.splitlines() if "::" in line}
    missing = sorted(on_disk - collected)
    if missing:
        print(f"check_collected: pytest collects no test from {len(missing)} test file(s):", file=sys.stderr)
        for path in missing:
            print(f"  {path}", file=sys.stderr)
        return 1
    print(f"check_collected: all {len(on_disk)} test files are collected", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
