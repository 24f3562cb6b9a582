"""Historical request logs: JSONL or CSV, one request per line (format in ``docs/bench_plan.md``).

Fields (extra fields/columns are ignored):

| field | required | meaning |
|---|---|---|
| ``prompt_tokens`` | yes | prompt length in tokens (integer >= 0) |
| ``output_tokens`` | yes | generated tokens (integer >= 0) |
| ``timestamp`` | yes | when the request arrived: Unix seconds (number) or ISO 8601 (``2025-01-31T12:00:00Z``; no zone = UTC) |
| ``priority`` | no | ``high`` / ``normal`` / ``low`` (default ``normal``) |

Every bad row is reported with its line number (1-based, physical lines of
the file; a CSV's header is line 1); none is skipped silently: reading fails
with :class:`LogParseError` listing them, unless the caller asks to skip
them, and then they are still returned.
"""

from __future__ import annotations

import csv
import json
import math
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from trtspec.errors import TrtspecError
from trtspec.wire import Priority

REQUIRED = ("prompt_tokens", "output_tokens", "timestamp")


@dataclass(frozen=True)
class LogRecord:
    line: int
    prompt_tokens: int
    output_tokens: int
    timestamp: float  # Unix seconds
    priority: str = "normal"


@dataclass(frozen=True)
class LogProblem:
    line: int
    message: str

    def __str__(self) -> str:
        return f"line {self.line}: {self.message}"


class LogParseError(TrtspecError):
    """Bad rows in a request log; ``problems`` lists every one with its line number."""

    def __init__(self, path: str, problems: list[LogProblem]) -> None:
        self.path = path
        self.problems = problems
        shown = "; ".join(str(p) for p in problems[:10])
        more = f"; ... and {len(problems) - 10} more" if len(problems) > 10 else ""
        super().__init__(
            f"{path}: {len(problems)} bad row{'s' if len(problems) != 1 else ''}: {shown}{more} "
            "(fix them, or pass --skip-bad-rows to plan without them)"
        )


@dataclass
class RequestLog:
    path: str
    format: str  # jsonl | csv
    records: list[LogRecord]
    problems: list[LogProblem]  # rows left out (only with skip_bad_rows)


def _int_field(value: object, name: str) -> int:
    if isinstance(value, bool):
        raise ValueError(f"{name} must be an integer >= 0, got {value!r}")
    if isinstance(value, int):
        n = value
    elif isinstance(value, float) and value.is_integer():
        n = int(value)
    elif isinstance(value, str) and value.strip().lstrip("+").isdigit():
        n = int(value.strip())
    else:
        raise ValueError(f"{name} must be an integer >= 0, got {value!r}")
    if n < 0:
        raise ValueError(f"{name} must be an integer >= 0, got {value!r}")
    return n


def parse_timestamp(value: object) -> float:
    """Unix seconds (number or numeric string) or ISO 8601 (no zone: UTC) -> Unix seconds."""
    if isinstance(value, bool) or value is None:
        raise ValueError(f"timestamp must be Unix seconds or ISO 8601, got {value!r}")
    if isinstance(value, (int, float)):
        t = float(value)
    else:
        text = str(value).strip()
        try:
            t = float(text)
        except ValueError:
            try:
                dt = datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
            except ValueError:
                raise ValueError(f"timestamp must be Unix seconds or ISO 8601, got {value!r}") from None
            if dt.tzinfo is None:
                dt = dt.replace(tzinfo=timezone.utc)
            t = dt.timestamp()
    if not math.isfinite(t) or t < 0:
        raise ValueError(f"timestamp must be Unix seconds or ISO 8601, got {value!r}")
    return t


def _record(line: int, row: dict) -> LogRecord:
    missing = [f for f in REQUIRED if row.get(f) in (None, "")]
    if missing:
        raise ValueError(f"missing {', '.join(missing)}")
    priority = row.get("priority")
    if priority in (None, ""):
        priority = "normal"
    if not isinstance(priority, str) or priority.strip().lower() not in {p.value for p in Priority}:
        raise ValueError(f"priority must be one of {', '.join(Priority)}, got {priority!r}")
    return LogRecord(
        line=line,
        prompt_tokens=_int_field(row["prompt_tokens"], "prompt_tokens"),
        output_tokens=_int_field(row["output_tokens"], "output_tokens"),
        timestamp=parse_timestamp(row["timestamp"]),
        priority=priority.strip().lower(),
    )


def _detect(path: Path, text: str) -> str:
    suffix = path.suffix.lower()
    if suffix in (".jsonl", ".ndjson", ".json"):
        return "jsonl"
    if suffix in (".csv", ".tsv"):
        return "csv"
    first = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
    return "jsonl" if first.startswith("{") else "csv"


def read_log(path: str | Path, *, skip_bad_rows: bool = False) -> RequestLog:
    """Read a request log; every bad row is a :class:`LogProblem` with its line number.

    Raises :class:`LogParseError` if there is any bad row (unless ``skip_bad_rows``)
    or no good one.
    """
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as e:
        raise TrtspecError(f"cannot read request log {p}: {e.strerror or e}") from None
    except UnicodeDecodeError as e:
        raise TrtspecError(f"{p}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    fmt = _detect(p, text)
    records: list[LogRecord] = []
    problems: list[LogProblem] = []
    if fmt == "jsonl":
        for n, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                problems.append(LogProblem(n, f"not valid JSON ({e.msg})"))
                continue
            if not isinstance(obj, dict):
                problems.append(LogProblem(n, "expected a JSON object"))
                continue
            try:
                records.append(_record(n, obj))
            except ValueError as e:
                problems.append(LogProblem(n, str(e)))
    else:
        lines = text.splitlines(keepends=True)
        delimiter = "\t" if p.suffix.lower() == ".tsv" else ","
        reader = csv.DictReader(lines, delimiter=delimiter)
        header = [h.strip() for h in (reader.fieldnames or [])]
        reader.fieldnames = header
        absent = [f for f in REQUIRED if f not in header]
        if absent:
            raise LogParseError(str(p), [LogProblem(1, f"the header lacks column(s) {', '.join(absent)}")])
        for row in reader:
            n = reader.line_num  # the physical line where this row ends (its line, unless a quoted cell spans lines)
            if not any((v or "").strip() for k, v in row.items() if k is not None):
                continue
            if None in row:  # more cells than header columns
                problems.append(LogProblem(n, f"{len(header) + len(row[None])} cells, the header has {len(header)}"))
                continue
            try:
                records.append(_record(n, {k: (v.strip() if isinstance(v, str) else v) for k, v in row.items()}))
            except ValueError as e:
                problems.append(LogProblem(n, str(e)))
    if problems and not skip_bad_rows:
        raise LogParseError(str(p), problems)
    if not records:
        raise LogParseError(str(p), problems or [LogProblem(0, "no requests in the log")])
    return RequestLog(str(p), fmt, records, problems)
