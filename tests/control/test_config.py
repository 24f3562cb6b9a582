"""The policy file: defaults, loading, and one error line per problem naming the field path."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from trtspec.control import Policy, PolicyError, dump_policy, load_policy, parse_policy
from trtspec.control.config import ControllerKind, Priority, RouteAction, RolloutMode
from trtspec.errors import TrtspecError


def problems(data: object) -> list[str]:
    with pytest.raises(PolicyError) as info:
        parse_policy(data, "p.yaml")
    return [str(p) for p in info.value.problems]


def test_defaults_are_the_numbers_of_the_issue() -> None:
    p = Policy()
    assert p.rollout.mode is RolloutMode.FULL
    assert p.rollout.fallback_budget == 0.03
    rules = p.routing.rules
    assert rules[0].when.context_tokens_gt == 64 and rules[0].action is RouteAction.SPECULATE
    assert rules[1].when.priority == [Priority.HIGH] and rules[1].action is RouteAction.TARGET_ONLY
    assert p.routing.default_action is RouteAction.SPECULATE
    assert p.draft_length.static.k == 5
    assert (p.draft_length.step.k, p.draft_length.step.k_reduced, p.draft_length.step.threshold) == (5, 3, 0.15)
    assert (p.draft_length.heuristic.increase, p.draft_length.heuristic.decrease) == (2, 1)
    assert p.draft_length.controller is ControllerKind.GOODPUT
    assert (p.fallback.zero_accept_iterations, p.fallback.enabled) == (3, True)
    assert (p.breaker.soft_threshold, p.breaker.hard_threshold) == (0.20, 0.30)


def test_empty_file_is_the_default_policy(policy_file) -> None:
    assert load_policy(policy_file("")) == Policy()
    assert load_policy(policy_file("# only a comment\n")) == Policy()


def test_partial_file_merges_defaults(policy_file) -> None:
    p = load_policy(policy_file("draft_length:\n  controller: step\nbreaker:\n  cooldown_s: 5\n"))
    assert p.draft_length.controller is ControllerKind.STEP
    assert p.breaker.cooldown_s == 5
    assert p.breaker.soft_threshold == 0.20  # untouched default
    assert p.draft_length.k_max == Policy().draft_length.k_max


def test_toml_is_read_by_suffix(policy_file) -> None:
    p = load_policy(policy_file('[rollout]\nmode = "canary"\ncanary_fraction = 0.25\n', "policy.toml"))
    assert p.rollout.mode is RolloutMode.CANARY and p.rollout.canary_fraction == 0.25


def test_dump_reads_back_unchanged(policy_file) -> None:
    p = parse_policy({"draft_length": {"controller": "heuristic", "k_max": 6}, "admission": {"max_speculating": 3,
                                                                                            "soft_max_speculating": 1}})
    assert load_policy(policy_file(dump_policy(p))) == p
    assert load_policy(policy_file(dump_policy(p, "json"), "p.json")) == p  # JSON is YAML


def test_value_out_of_range_names_the_path_and_the_bound() -> None:
    assert problems({"breaker": {"soft_threshold": 1.5}}) == ["breaker.soft_threshold: must be <= 1.0 (got 1.5)"]
    assert problems({"draft_length": {"k_max": 0}}) == ["draft_length.k_max: must be >= 1 (got 0)"]


def test_unknown_keys_are_errors_listing_the_allowed_ones() -> None:
    (msg,) = problems({"fallback": {"cooldown": 3}})
    assert msg.startswith("fallback.cooldown: unknown key; allowed: enabled, zero_accept_iterations, cooldown_tokens")
    (msg,) = problems({"breakers": {}})
    assert msg.startswith("breakers: unknown key; allowed: version, rollout, routing")


def test_enum_errors_list_the_choices() -> None:
    assert problems({"rollout": {"mode": "half"}}) == [
        "rollout.mode: must be one of 'off', 'offline_only', 'canary' or 'full' (got 'half')"
    ]
    assert problems({"routing": {"rules": [{"when": {"priority": ["urgent"]}, "action": "speculate",
                                            "reason": "x"}]}}) == [
        "routing.rules[0].when.priority[0]: must be one of 'high', 'normal' or 'low' (got 'urgent')"
    ]


def test_cross_field_rules_point_at_the_field() -> None:
    assert problems({"breaker": {"soft_threshold": 0.4}}) == [
        "breaker.soft_threshold: must be below hard_threshold (0.3) (got 0.4)"
    ]
    assert problems({"draft_length": {"static": {"k": 9}}}) == ["draft_length.static.k: must be <= k_max (8) (got 9)"]
    assert problems({"draft_length": {"step": {"recover_below": 0.2}}}) == [
        "draft_length.step.recover_below: must be <= threshold (0.15) (got 0.2)"
    ]
    assert problems({"admission": {"max_speculating": 2}}) == [
        "admission.soft_max_speculating: must be <= max_speculating (2) (got 4)"
    ]


def test_every_problem_is_reported_one_per_line() -> None:
    with pytest.raises(PolicyError) as info:
        parse_policy({"breaker": {"cooldown_s": -1, "x": 1}, "rollout": {"canary_fraction": 2}}, "p.yaml")
    err = info.value
    assert isinstance(err, TrtspecError)
    assert sorted(p.path for p in err.problems) == ["breaker.cooldown_s", "breaker.x", "rollout.canary_fraction"]
    lines = str(err).splitlines()
    assert lines[0] == "p.yaml: invalid policy (3 problems):"
    assert len(lines) == 4


def test_missing_fields_and_bad_types() -> None:
    assert problems({"routing": {"rules": [{"when": {}, "action": "speculate"}]}}) == [
        "routing.rules[0].reason: is required"
    ]
    assert problems({"breaker": "strict"}) == ["breaker: must be a mapping of keys to values (got 'strict')"]
    assert problems(["a", "list"]) == ["the top level must be a mapping, got list"]
    assert problems({"version": 2}) == ["version: must be 1 (got 2)"]
    (msg,) = problems({"admission": {"priority_share": {"vip": 1.0}}})
    assert msg.startswith("admission.priority_share.vip: must be one of 'high', 'normal' or 'low'")


def test_unreadable_and_malformed_files(policy_file, tmp_path) -> None:
    with pytest.raises(PolicyError, match="cannot read the file"):
        load_policy(tmp_path / "missing.yaml")
    with pytest.raises(PolicyError, match=r"not valid YAML at line 3, column \d+"):
        load_policy(policy_file("breaker:\n  soft_threshold: 0.2\n bad indent: 1\n"))
    with pytest.raises(PolicyError, match="not valid TOML"):
        load_policy(policy_file("[rollout\n", "p.toml"))


def test_the_reference_in_the_docs_is_the_default_policy() -> None:
    doc = (Path(__file__).resolve().parents[2] / "docs" / "control.md").read_text()
    start = doc.index("```yaml\nversion: 1") + len("```yaml\n")
    block = doc[start:doc.index("```", start)]
    assert yaml.safe_load(block) == Policy().to_dict()
