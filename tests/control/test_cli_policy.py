"""``trtspec policy show`` / ``check``, through Typer's test runner on the sub-app."""

from __future__ import annotations

import json

import yaml
from typer.testing import CliRunner

from trtspec.cli.policy import app
from trtspec.control import Policy, load_policy

runner = CliRunner()


def test_show_prints_the_defaults_as_yaml_that_loads_back(policy_file) -> None:
    r = runner.invoke(app, ["show"])
    assert r.exit_code == 0, r.output
    assert yaml.safe_load(r.stdout) == Policy().to_dict()
    assert load_policy(policy_file(r.stdout)) == Policy()


def test_show_merges_a_file_with_the_defaults(policy_file) -> None:
    f = policy_file("draft_length:\n  controller: heuristic\nbreaker:\n  cooldown_s: 7\n")
    r = runner.invoke(app, ["show", "--file", str(f), "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["draft_length"]["controller"] == "heuristic"
    assert out["breaker"]["cooldown_s"] == 7
    assert out["breaker"]["soft_threshold"] == 0.2
    assert out["routing"]["rules"][0] == {"when": {"context_tokens_gt": 64}, "action": "speculate",
                                          "reason": "long_context"}


def test_check_accepts_a_valid_file(policy_file) -> None:
    f = policy_file("rollout:\n  mode: canary\n  canary_fraction: 0.1\n")
    r = runner.invoke(app, ["check", str(f)])
    assert r.exit_code == 0, r.output
    assert r.stdout.startswith(f"ok: {f} is a valid policy (rollout canary, controller goodput")
    r = runner.invoke(app, ["check", str(f), "--json"])
    out = json.loads(r.stdout)
    assert out["valid"] is True and out["policy"]["rollout"]["canary_fraction"] == 0.1


def test_check_prints_one_line_per_problem(policy_file) -> None:
    f = policy_file(
        "breaker:\n  soft_threshold: 1.5\n  colldown_s: 3\n"
        "routing:\n  rules:\n    - when: {priority: [urgent]}\n      action: speculate\n      reason: x\n"
    )
    r = runner.invoke(app, ["check", str(f)])
    assert r.exit_code == 1
    assert r.stdout == ""
    lines = r.stderr.strip().splitlines()
    assert lines == [
        f"error: {f}: routing.rules[0].when.priority[0]: must be one of 'high', 'normal' or 'low' (got 'urgent')",
        f"error: {f}: breaker.soft_threshold: must be <= 1.0 (got 1.5)",
        f"error: {f}: breaker.colldown_s: unknown key; allowed: enabled, soft_threshold, hard_threshold, "
        "window_s, window_tokens, min_tokens, recover_margin, min_dwell_s, cooldown_s, half_open_fraction, "
        "half_open_min_tokens",
    ]


def test_check_json_lists_the_problems(policy_file) -> None:
    f = policy_file("admission:\n  max_speculating: -1\n")
    r = runner.invoke(app, ["check", str(f), "--json"])
    assert r.exit_code == 1
    out = json.loads(r.stdout)
    assert out["valid"] is False
    assert out["errors"] == [{"path": "admission.max_speculating", "message": "must be >= 0 (got -1)"}]


def test_unreadable_files(policy_file, tmp_path) -> None:
    r = runner.invoke(app, ["check", str(tmp_path / "nope.yaml")])
    assert r.exit_code == 1 and "cannot read the file" in r.stderr
    r = runner.invoke(app, ["show", "--file", str(policy_file("a: [1\n"))])
    assert r.exit_code == 1 and "not valid YAML" in r.stderr


def test_no_arguments_prints_help() -> None:
    r = runner.invoke(app, [])
    assert "show" in r.output and "check" in r.output
