"""Routing: ordered rules, first match wins; the defaults reproduce the operators' rule."""

from __future__ import annotations

import pytest

from trtspec.control import Policy, Priority, RequestInfo, parse_policy
from trtspec.control.router import Router


def route(info: RequestInfo, policy: Policy | None = None) -> tuple[bool, str]:
    v = Router((policy or Policy()).routing).route(info)
    return v.speculate, v.reason


@pytest.mark.parametrize(
    ("context", "priority", "expected"),
    [
        (65, Priority.HIGH, (True, "long_context")),  # rule 1 wins over rule 2
        (65, Priority.LOW, (True, "long_context")),
        (64, Priority.HIGH, (False, "high_priority")),  # 64 is not > 64
        (10, Priority.HIGH, (False, "high_priority")),
        (64, Priority.NORMAL, (True, "default")),
        (3, Priority.LOW, (True, "default")),
    ],
)
def test_default_rules(context: int, priority: Priority, expected: tuple[bool, str]) -> None:
    assert route(RequestInfo(context_tokens=context, priority=priority)) == expected


def test_default_action_can_be_target_only() -> None:
    p = parse_policy({"routing": {"default_action": "target_only", "default_reason": "short_context"}})
    assert route(RequestInfo(context_tokens=20), p) == (False, "short_context")
    assert route(RequestInfo(context_tokens=200), p) == (True, "long_context")


def test_custom_rules_all_conditions_must_hold_and_order_matters() -> None:
    p = parse_policy({"routing": {"rules": [
        {"when": {"max_new_tokens_le": 4}, "action": "target_only", "reason": "short_output"},
        {"when": {"context_tokens_gt": 100, "priority": ["low", "normal"]}, "action": "speculate",
         "reason": "long_background"},
        {"when": {"context_tokens_le": 100}, "action": "target_only", "reason": "short_context"},
        {"when": {"context_tokens_gt": 0}, "action": "speculate", "reason": "never_reached_for_short"},
    ], "default_action": "target_only", "default_reason": "fallthrough"}})
    assert route(RequestInfo(context_tokens=500, max_new_tokens=2), p) == (False, "short_output")
    assert route(RequestInfo(context_tokens=500, max_new_tokens=50, priority=Priority.LOW), p) == (
        True, "long_background")
    assert route(RequestInfo(context_tokens=500, max_new_tokens=50, priority=Priority.HIGH), p) == (
        True, "never_reached_for_short")
    assert route(RequestInfo(context_tokens=50, max_new_tokens=50), p) == (False, "short_context")
    assert route(RequestInfo(context_tokens=0, max_new_tokens=50), p) == (False, "short_context")


def test_no_rules_means_the_default() -> None:
    p = parse_policy({"routing": {"rules": []}})
    assert route(RequestInfo(context_tokens=5, priority=Priority.HIGH), p) == (True, "default")
