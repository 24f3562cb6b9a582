"""``trtspec plan`` through Typer's test runner (the command mounted on a local app)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from trtspec.cli.plan import plan
from trtspec.control import load_policy

app = typer.Typer()
app.command()(plan)
runner = CliRunner()

S = (1 - 0.8**5) / 0.2 / (4 * 0.1 + 1)


def test_plan_json(small_log: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    r = runner.invoke(app, [str(small_log), "--alpha", "0.8", "--c", "0.1", "--k", "4", "--tokens-per-s", "100",
                            "--gpu-price", "3", "--out", str(out), "--json"])
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)
    assert data["speedup"]["recommended_policy"] == pytest.approx(S)
    assert data["roi"]["gpu_hours_per_day_off"] == pytest.approx(4.8)
    assert data["policy"]["threshold"] == 0
    assert load_policy(data["files"]["policy_offline_only"]).rollout.mode.value == "offline_only"
    assert json.loads((out / "plan.json").read_text())["log"]["requests"] == 5
    assert (out / "plan.html").read_text().count("data:image/png;base64,") >= 2
    assert (out / "plan.md").read_text().count("](data:image/png;base64,") >= 2


def test_plan_text(small_log: Path, tmp_path: Path) -> None:
    r = runner.invoke(app, [str(small_log), "--alpha", "0.8", "--c", "0.1", "--k", "4", "--out", str(tmp_path / "o")])
    assert r.exit_code == 0, r.output
    assert "expected overall speedup" in r.stdout
    assert "above the current threshold (64 tokens): 40.0% of requests" in r.stdout


def test_bad_rows_fail_with_their_line_numbers_unless_skipped(small_log: Path, tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    lines = small_log.read_text().splitlines()
    lines.insert(2, '{"prompt_tokens": "ten", "output_tokens": 3, "timestamp": 5}')  # line 3
    lines.append("not json")  # line 7
    bad.write_text("\n".join(lines) + "\n")
    args = [str(bad), "--alpha", "0.8", "--c", "0.1", "--out", str(tmp_path / "o")]
    r = runner.invoke(app, args)
    assert r.exit_code == 1
    assert f"{bad}:3: prompt_tokens must be an integer" in r.stderr
    assert f"{bad}:7: not valid JSON" in r.stderr
    assert "2 bad row(s)" in r.stderr and "--skip-bad-rows" in r.stderr
    r = runner.invoke(app, [*args, "--skip-bad-rows", "--json"])
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)
    assert [b["line"] for b in data["log"]["bad_rows"]] == [3, 7]
    assert data["log"]["requests"] == 5


def test_a_log_that_cannot_be_read_is_one_line(tmp_path: Path) -> None:
    for path, why in ((tmp_path / "missing.jsonl", "No such file or directory"), (tmp_path, "Is a directory")):
        r = runner.invoke(app, [str(path), "--alpha", "0.8", "--c", "0.1", "--out", str(tmp_path / "o")])
        assert r.exit_code == 1 and isinstance(r.exception, SystemExit), r.exception  # not a traceback
        assert r.stderr == f"error: cannot read request log {path}: {why}\n"


def test_a_bench_file_that_cannot_be_read_is_one_line(small_log: Path, tmp_path: Path) -> None:
    garbage = tmp_path / "garbage.json"
    garbage.write_text("garbage")
    for path, why in ((tmp_path / "missing.json", "No such file or directory"),
                      (garbage, "not JSON (Expecting value: line 1 column 1 (char 0))")):
        r = runner.invoke(app, [str(small_log), "--bench", str(path), "--out", str(tmp_path / "o")])
        assert r.exit_code == 1 and r.stderr == f"error: cannot read bench results {path}: {why}\n"


def test_an_out_that_cannot_be_made_is_one_line(small_log: Path, tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    r = runner.invoke(app, [str(small_log), "--alpha", "0.8", "--c", "0.1", "--out", str(blocker / "o")])
    assert r.exit_code == 1 and isinstance(r.exception, SystemExit), r.exception
    assert r.stderr == f"error: --out {blocker / 'o'}: {blocker} is not a directory\n"


def test_inputs_are_required(small_log: Path, tmp_path: Path) -> None:
    r = runner.invoke(app, [str(small_log), "--alpha", "0.8", "--out", str(tmp_path / "o")])
    assert r.exit_code == 1
    assert "--bench RESULTS.json, or --alpha and --c" in r.stderr
    r = runner.invoke(app, [str(small_log), "--alpha", "1.5", "--c", "0.1", "--out", str(tmp_path / "o")])
    assert r.exit_code == 1 and "--alpha must be in [0, 1]" in r.stderr


def test_plan_compares_the_drafters_of_the_bench_files(small_log: Path, tmp_path: Path, make_bench) -> None:
    files = []
    for name, accepted in (("suffix", (60, 90)), ("model", (30, 40))):
        f = tmp_path / f"{name}.json"
        f.write_text(json.dumps(make_bench(1.0, 1.2, drafter=name, accepted=accepted).to_dict()))
        files += ["--bench", str(f)]
    out = tmp_path / "out"
    r = runner.invoke(app, [str(small_log), *files, "--rate-per-gpu", "1", "--out", str(out), "--json"])
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)
    assert {n: d["recommended"] for n, d in data["by_drafter"].items()} == {"suffix": True, "model": False}
    assert data["inputs"]["source"] == f"bench: {tmp_path / 'suffix.json'}"
    assert json.loads((out / "plan.json").read_text())["by_drafter"] == data["by_drafter"]
    assert "## By drafter" in (out / "plan.md").read_text()
    png = (out / "speedup_by_drafter.png").read_bytes()
    assert png.startswith(b"\x89PNG") and data["files"]["drafters_png"] == str(out / "speedup_by_drafter.png")
    assert (out / "plan.md").read_text().count("![Expected speedup by drafter](data:image/png;base64,") == 1
    r = runner.invoke(app, [str(small_log), *files, "--rate-per-gpu", "1", "--out", str(out)])
    assert "drafter: serve with drafter suffix" in r.stdout


def test_plan_of_an_older_bench_file_has_one_default_drafter(small_log: Path, tmp_path: Path, make_bench) -> None:
    f = tmp_path / "old.json"
    f.write_text(json.dumps(make_bench(1.0, 1.2).to_dict()))  # written before bench --drafter: no config.drafter
    r = runner.invoke(app, [str(small_log), "--bench", str(f), "--out", str(tmp_path / "o"), "--json"])
    assert r.exit_code == 0, r.output
    assert list(json.loads(r.stdout)["by_drafter"]) == ["default"]
    assert not (tmp_path / "o" / "speedup_by_drafter.png").exists()  # one drafter: nothing to compare
