"""Per-request routing: an ordered rule list, first match wins.

Rule: walk ``routing.rules`` in order; the first rule whose conditions all hold
decides (``speculate`` or ``target_only``) and gives its ``reason``; if none
matches, ``routing.default_action`` with ``routing.default_reason``. The
default rules reproduce the operators' rule exactly:

1. context longer than 64 tokens -> speculate (``long_context``);
2. else priority ``high`` -> target only (``high_priority``);
3. else the default (``speculate``, ``default``).
"""

from __future__ import annotations

from dataclasses import dataclass

from trtspec.control.config import RouteAction, RouteRule, RoutingConfig, RuleCondition
from trtspec.control.types import RequestInfo


@dataclass(frozen=True)
class RouterVerdict:
    speculate: bool
    reason: str
    rule_index: int | None  # None: the default applied


def condition_holds(cond: RuleCondition, info: RequestInfo) -> bool:
    """True when every condition given in ``cond`` holds for ``info``."""
    if cond.context_tokens_gt is not None and not info.context_tokens > cond.context_tokens_gt:
        return False
    if cond.context_tokens_le is not None and not info.context_tokens <= cond.context_tokens_le:
        return False
    if cond.max_new_tokens_gt is not None and not info.max_new_tokens > cond.max_new_tokens_gt:
        return False
    if cond.max_new_tokens_le is not None and not info.max_new_tokens <= cond.max_new_tokens_le:
        return False
    if cond.priority is not None and info.priority not in cond.priority:
        return False
    return True


class Router:
    """First matching rule wins; stateless, so safe from any thread."""

    def __init__(self, config: RoutingConfig) -> None:
        self._rules: tuple[RouteRule, ...] = tuple(config.rules)
        self._default = RouterVerdict(config.default_action is RouteAction.SPECULATE, config.default_reason, None)

    def route(self, info: RequestInfo) -> RouterVerdict:
        for i, rule in enumerate(self._rules):
            if condition_holds(rule.when, info):
                return RouterVerdict(rule.action is RouteAction.SPECULATE, rule.reason, i)
        return self._default
