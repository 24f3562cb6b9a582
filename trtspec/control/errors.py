"""Errors of the control plane."""

from __future__ import annotations

from dataclasses import dataclass

from trtspec.errors import TrtspecError


@dataclass(frozen=True)
class PolicyProblem:
    """One problem in a policy file: the dotted field path and what is allowed there."""

    path: str  # e.g. "breaker.soft_threshold", "routing.rules[0].when.priority"; "" for the whole file
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}" if self.path else self.message


class PolicyError(TrtspecError):
    """A policy file is unreadable or invalid. ``str()`` gives one line per problem."""

    def __init__(self, source: str, problems: list[PolicyProblem]) -> None:
        self.source = source
        self.problems = problems
        head = f"{source}: invalid policy" if source else "invalid policy"
        if len(problems) == 1:
            super().__init__(f"{head}: {problems[0]}")
        else:
            lines = "\n".join(f"  {p}" for p in problems)
            super().__init__(f"{head} ({len(problems)} problems):\n{lines}")
