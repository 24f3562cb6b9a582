"""Request logs: JSONL and CSV; every bad row reported with its line number, none skipped silently."""

from __future__ import annotations

from pathlib import Path

import pytest

from trtspec.plan.logs import LogParseError, parse_timestamp, read_log


def write(tmp_path: Path, name: str, text: str) -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def test_jsonl_good_rows(tmp_path: Path) -> None:
    p = write(tmp_path, "log.jsonl",
              '{"prompt_tokens": 10, "output_tokens": 5, "timestamp": 100, "priority": "high", "extra": 1}\n'
              "\n"  # blank lines are not rows
              '{"prompt_tokens": 7, "output_tokens": 0, "timestamp": "1970-01-01T00:03:20Z"}\n')
    log = read_log(p)
    assert log.format == "jsonl" and log.problems == []
    a, b = log.records
    assert (a.line, a.prompt_tokens, a.output_tokens, a.timestamp, a.priority) == (1, 10, 5, 100.0, "high")
    assert (b.line, b.timestamp, b.priority) == (3, 200.0, "normal")


def test_jsonl_bad_rows_are_reported_with_line_numbers(tmp_path: Path) -> None:
    p = write(tmp_path, "log.jsonl", "\n".join([
        '{"prompt_tokens": 10, "output_tokens": 5, "timestamp": 1}',      # 1 ok
        '{"prompt_tokens": 10, "output_tokens": 5, "timestamp": 2',       # 2 truncated JSON
        '{"prompt_tokens": -3, "output_tokens": 5, "timestamp": 3}',      # 3 negative
        '',                                                                # 4 blank: skipped, still counted
        '{"output_tokens": 5, "timestamp": 5}',                           # 5 missing prompt_tokens
        '{"prompt_tokens": 1, "output_tokens": 5, "timestamp": 6, "priority": "urgent"}',  # 6 bad priority
        '{"prompt_tokens": 1, "output_tokens": "many", "timestamp": 7}',  # 7 not an integer
        '{"prompt_tokens": 1, "output_tokens": 2, "timestamp": "yesterday"}',  # 8 bad timestamp
        '[1, 2, 3]',                                                       # 9 not an object
        '{"prompt_tokens": 4, "output_tokens": 2, "timestamp": 9}',       # 10 ok
    ]) + "\n")
    with pytest.raises(LogParseError) as e:
        read_log(p)
    lines = [(pr.line, pr.message) for pr in e.value.problems]
    assert [n for n, _ in lines] == [2, 3, 5, 6, 7, 8, 9]
    msgs = dict(lines)
    assert "not valid JSON" in msgs[2]
    assert "prompt_tokens must be an integer >= 0" in msgs[3]
    assert msgs[5] == "missing prompt_tokens"
    assert "priority must be one of high, normal, low" in msgs[6]
    assert "output_tokens must be an integer" in msgs[7]
    assert "timestamp must be" in msgs[8]
    assert msgs[9] == "expected a JSON object"
    assert "7 bad rows" in str(e.value) and "line 2:" in str(e.value)
    # with skip_bad_rows the good rows are used and the bad ones still listed
    log = read_log(p, skip_bad_rows=True)
    assert [r.line for r in log.records] == [1, 10]
    assert [pr.line for pr in log.problems] == [2, 3, 5, 6, 7, 8, 9]


def test_csv_rows_and_line_numbers(tmp_path: Path) -> None:
    p = write(tmp_path, "log.csv",
              "timestamp,prompt_tokens,output_tokens,priority,user\n"   # 1 header (any column order)
              "2025-01-31T12:00:00,12,30,low,a\n"                       # 2 ok (no zone: UTC)
              "2025-01-31T12:00:10,x,30,,b\n"                           # 3 bad prompt_tokens
              "\n"                                                       # 4 blank
              "2025-01-31T12:00:20,5,,normal,c\n"                       # 5 missing output_tokens
              "2025-01-31T12:00:30,5,6,normal,c,extra\n"                # 6 too many cells
              "1738324840,8,9,,d\n")                                    # 7 ok, Unix seconds, default priority
    with pytest.raises(LogParseError) as e:
        read_log(p)
    assert [(pr.line, pr.message.split(" ")[0]) for pr in e.value.problems] == [(3, "prompt_tokens"), (5, "missing"), (6, "6")]
    log = read_log(p, skip_bad_rows=True)
    assert log.format == "csv"
    assert [(r.line, r.prompt_tokens, r.priority) for r in log.records] == [(2, 12, "low"), (7, 8, "normal")]
    assert log.records[0].timestamp == pytest.approx(1738324800.0)  # 2025-01-31T12:00:00Z


def test_csv_header_must_name_the_required_columns(tmp_path: Path) -> None:
    p = write(tmp_path, "log.csv", "prompt_tokens,output_tokens\n1,2\n")
    with pytest.raises(LogParseError) as e:
        read_log(p, skip_bad_rows=True)
    assert e.value.problems[0].line == 1 and "timestamp" in e.value.problems[0].message


def test_a_log_without_any_good_row_fails_even_when_skipping(tmp_path: Path) -> None:
    p = write(tmp_path, "log.jsonl", '{"prompt_tokens": 1}\n')
    with pytest.raises(LogParseError):
        read_log(p, skip_bad_rows=True)


def test_parse_timestamp() -> None:
    assert parse_timestamp(12.5) == 12.5
    assert parse_timestamp("12.5") == 12.5
    assert parse_timestamp("1970-01-01T00:01:00+00:00") == 60.0
    assert parse_timestamp("1970-01-01T01:01:00+01:00") == 60.0
    for bad in ("", "soon", True, -1, float("nan")):
        with pytest.raises(ValueError):
            parse_timestamp(bad)
