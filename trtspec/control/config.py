"""The policy file: one YAML (or TOML) document that configures the whole control plane.

Every section and field has a default (the numbers of the design issue), so an
empty file is a valid policy. Unknown keys are errors. Problems are reported
one per line, each naming the dotted field path and what is allowed there
(see :class:`~trtspec.control.errors.PolicyError`). ``docs/control.md`` is the
reference for every field.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import tomllib
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from trtspec.control.errors import PolicyError, PolicyProblem
from trtspec.decoding.drafters import DrafterOptions
from trtspec.wire import Priority



class _FieldError(ValueError):
    """A cross-field rule broken inside a section; ``field`` is the dotted path within it."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_default=True, use_enum_values=False)


# -- rollout -------------------------------------------------------------------


class RolloutMode(str, enum.Enum):
    OFF = "off"  # nothing speculates
    OFFLINE_ONLY = "offline_only"  # only requests marked offline (batch jobs, benchmarks) speculate
    CANARY = "canary"  # a deterministic share of requests (by request id) speculates
    FULL = "full"  # every request may speculate


class RolloutConfig(_Section):
    mode: RolloutMode = RolloutMode.FULL
    canary_fraction: float = Field(default=0.05, ge=0.0, le=1.0)
    fallback_budget: float = Field(default=0.03, ge=0.0, le=1.0)
    budget_window_requests: int = Field(default=500, ge=1)
    budget_min_requests: int = Field(default=20, ge=1)


# -- routing -------------------------------------------------------------------


class RouteAction(str, enum.Enum):
    SPECULATE = "speculate"
    TARGET_ONLY = "target_only"


class RuleCondition(_Section):
    """Conditions of one rule; all given ones must hold (an empty condition matches everything)."""

    context_tokens_gt: int | None = Field(default=None, ge=0)
    context_tokens_le: int | None = Field(default=None, ge=0)
    max_new_tokens_gt: int | None = Field(default=None, ge=0)
    max_new_tokens_le: int | None = Field(default=None, ge=0)
    priority: list[Priority] | None = None


class RouteRule(_Section):
    when: RuleCondition
    action: RouteAction
    reason: str = Field(min_length=1, pattern=r"^[a-z][a-z0-9_]*$")


def _default_rules() -> list[RouteRule]:
    return [
        RouteRule(when=RuleCondition(context_tokens_gt=64), action=RouteAction.SPECULATE, reason="long_context"),
        RouteRule(
            when=RuleCondition(priority=[Priority.HIGH]), action=RouteAction.TARGET_ONLY, reason="high_priority"
        ),
    ]


class RoutingConfig(_Section):
    rules: list[RouteRule] = Field(default_factory=_default_rules)
    default_action: RouteAction = RouteAction.SPECULATE
    default_reason: str = Field(default="default", min_length=1, pattern=r"^[a-z][a-z0-9_]*$")


# -- draft length -----------------------------------------------------------------


class ControllerKind(str, enum.Enum):
    STATIC = "static"
    STEP = "step"
    HEURISTIC = "heuristic"
    GOODPUT = "goodput"


class StaticConfig(_Section):
    k: int = Field(default=5, ge=0)


class StepConfig(_Section):
    k: int = Field(default=5, ge=1)
    k_reduced: int = Field(default=3, ge=0)
    threshold: float = Field(default=0.15, ge=0.0, le=1.0)
    recover_below: float = Field(default=0.10, ge=0.0, le=1.0)
    window_tokens: int = Field(default=40, ge=1)
    min_tokens: int = Field(default=10, ge=1)

    @model_validator(mode="after")
    def _ordered(self) -> StepConfig:
        if self.k_reduced > self.k:
            raise _FieldError("k_reduced", f"must be <= k ({self.k}) (got {self.k_reduced})")
        if self.recover_below > self.threshold:
            raise _FieldError(
                "recover_below", f"must be <= threshold ({self.threshold}) (got {self.recover_below})"
            )
        return self


class HeuristicConfig(_Section):
    initial_k: int = Field(default=5, ge=1)
    increase: int = Field(default=2, ge=0)
    decrease: int = Field(default=1, ge=0)


class GoodputConfig(_Section):
    prior_acceptance: float = Field(default=0.7, gt=0.0, lt=1.0)
    prior_strength: float = Field(default=2.0, gt=0.0)
    memory_iterations: int = Field(default=500, ge=1)
    timing_window: int = Field(default=16, ge=1)
    prior_draft_cost: float = Field(default=0.25, ge=0.0)
    prior_verify_cost_per_token: float = Field(default=0.1, ge=0.0)
    min_gain: float = Field(default=0.02, ge=0.0)
    explore_share: float = Field(default=0.02, ge=0.0, le=1.0)
    probe_share: float = Field(default=0.1, ge=0.0, le=1.0)
    request_prior_strength: float = Field(default=4.0, gt=0.0)
    request_history: int = Field(default=50, ge=1)
    min_paying_share: float = Field(default=0.1, ge=0.0, le=1.0)
    probe_k: int = Field(default=2, ge=1)


class DraftLengthConfig(_Section):
    controller: ControllerKind = ControllerKind.GOODPUT
    k_max: int = Field(default=8, ge=1, le=64)
    static: StaticConfig = Field(default_factory=StaticConfig)
    step: StepConfig = Field(default_factory=StepConfig)
    heuristic: HeuristicConfig = Field(default_factory=HeuristicConfig)
    goodput: GoodputConfig = Field(default_factory=GoodputConfig)

    @model_validator(mode="after")
    def _within_k_max(self) -> DraftLengthConfig:
        for name, k in (
            ("static.k", self.static.k),
            ("step.k", self.step.k),
            ("heuristic.initial_k", self.heuristic.initial_k),
            ("goodput.probe_k", self.goodput.probe_k),
        ):
            if k > self.k_max:
                raise _FieldError(name, f"must be <= k_max ({self.k_max}) (got {k})")
        return self


# -- fallback, breaker, admission ---------------------------------------------------


class FallbackConfig(_Section):
    enabled: bool = True
    zero_accept_iterations: int = Field(default=3, ge=1)
    cooldown_tokens: int = Field(default=32, ge=1)


class BreakerConfig(_Section):
    enabled: bool = True
    soft_threshold: float = Field(default=0.20, ge=0.0, le=1.0)
    hard_threshold: float = Field(default=0.30, ge=0.0, le=1.0)
    window_s: float = Field(default=60.0, gt=0.0)
    window_tokens: int = Field(default=2000, ge=1)
    min_tokens: int = Field(default=100, ge=1)
    recover_margin: float = Field(default=0.02, ge=0.0, le=1.0)
    min_dwell_s: float = Field(default=10.0, ge=0.0)
    cooldown_s: float = Field(default=30.0, ge=0.0)
    half_open_fraction: float = Field(default=0.1, gt=0.0, le=1.0)
    half_open_min_tokens: int = Field(default=50, ge=1)

    @model_validator(mode="after")
    def _ordered(self) -> BreakerConfig:
        if self.soft_threshold >= self.hard_threshold:
            raise _FieldError(
                "soft_threshold",
                f"must be below hard_threshold ({self.hard_threshold}) (got {self.soft_threshold})",
            )
        return self


def _default_shares() -> dict[Priority, float]:
    return {Priority.HIGH: 1.0, Priority.NORMAL: 1.0, Priority.LOW: 0.5}


class AdmissionConfig(_Section):
    max_speculating: int = Field(default=16, ge=0)
    soft_max_speculating: int = Field(default=4, ge=0)
    priority_share: dict[Priority, Annotated[float, Field(ge=0.0, le=1.0)]] = Field(default_factory=_default_shares)

    @model_validator(mode="after")
    def _check(self) -> AdmissionConfig:
        if self.soft_max_speculating > self.max_speculating:
            raise _FieldError(
                "soft_max_speculating",
                f"must be <= max_speculating ({self.max_speculating}) (got {self.soft_max_speculating})",
            )
        for p in Priority:
            self.priority_share.setdefault(p, 1.0)
        return self


class Policy(_Section):
    """The effective policy: every section with its defaults merged in."""

    version: Literal[1] = 1
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    routing: RoutingConfig = Field(default_factory=RoutingConfig)
    draft_length: DraftLengthConfig = Field(default_factory=DraftLengthConfig)
    fallback: FallbackConfig = Field(default_factory=FallbackConfig)
    breaker: BreakerConfig = Field(default_factory=BreakerConfig)
    admission: AdmissionConfig = Field(default_factory=AdmissionConfig)
    drafters: DrafterOptions = Field(default_factory=DrafterOptions)
    # The sampling rule of a request that does not send ``exact``: position-keyed draws, so a seed gives
    # the same output with speculation on or off (docs/runtime.md). Greedy exactness is the target's own.
    exact: bool = False

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json", exclude_none=True)


# -- loading and errors ------------------------------------------------------------


def _dotted(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        if part == "[key]":  # pydantic's marker for a bad mapping key; the key itself is already in loc
            continue
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


def _model_at(loc: tuple[int | str, ...]) -> type | None:
    """The model class (a pydantic model or a dataclass) that holds the field at ``loc`` (to list allowed keys)."""
    model: Any = Policy
    for part in loc[:-1]:
        if isinstance(part, int):
            continue
        if not (isinstance(model, type) and issubclass(model, BaseModel)) or part not in model.model_fields:
            return None
        ann = model.model_fields[part].annotation
        args = getattr(ann, "__args__", ())
        candidates = [ann, *args, *(a for x in args for a in getattr(x, "__args__", ()))]
        model = next((c for c in candidates if _is_model(c)), None)
        if model is None:
            return None
    return model if _is_model(model) else None


def _is_model(c: Any) -> bool:
    return isinstance(c, type) and (issubclass(c, BaseModel) or dataclasses.is_dataclass(c))


def _keys(model: type) -> list[str]:
    if issubclass(model, BaseModel):
        return list(model.model_fields)
    return [f.name for f in dataclasses.fields(model)]


def _got(value: Any) -> str:
    text = json.dumps(value, default=str) if not isinstance(value, str) else repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _problem(err: dict[str, Any]) -> PolicyProblem:
    loc = tuple(err["loc"])
    kind = err["type"]
    ctx = err.get("ctx") or {}
    got = f" (got {_got(err['input'])})" if "input" in err and kind != "missing" else ""
    if kind in ("extra_forbidden", "unexpected_keyword_argument"):
        model = _model_at(loc)
        allowed = ", ".join(_keys(model)) if model else "see docs/control.md"
        return PolicyProblem(_dotted(loc), f"unknown key; allowed: {allowed}")
    if kind == "value_error":
        cause = ctx.get("error")
        if isinstance(cause, _FieldError):  # a cross-field rule: point at the field it names
            return PolicyProblem(_dotted((*loc, *cause.field.split("."))), str(cause))
        return PolicyProblem(_dotted(loc), str(cause or err["msg"]))
    simple = {
        "less_than_equal": lambda: f"must be <= {ctx.get('le')}",
        "less_than": lambda: f"must be < {ctx.get('lt')}",
        "greater_than_equal": lambda: f"must be >= {ctx.get('ge')}",
        "greater_than": lambda: f"must be > {ctx.get('gt')}",
        "enum": lambda: f"must be one of {ctx.get('expected')}",
        "literal_error": lambda: f"must be {ctx.get('expected')}",
        "missing": lambda: "is required",
        "string_pattern_mismatch": lambda: "must be a lowercase identifier (letters, digits, _)",
        "model_type": lambda: "must be a mapping of keys to values",
        "model_attributes_type": lambda: "must be a mapping of keys to values",
    }
    if kind in simple:
        return PolicyProblem(_dotted(loc), simple[kind]() + got)
    return PolicyProblem(_dotted(loc), f"{err['msg'][0].lower()}{err['msg'][1:]}{got}")


def parse_policy(data: Any, source: str = "") -> Policy:
    """Validate a decoded document (a mapping; ``None`` means empty) into a :class:`Policy`."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise PolicyError(source, [PolicyProblem("", f"the top level must be a mapping, got {type(data).__name__}")])
    try:
        return Policy.model_validate(data)
    except ValidationError as e:
        raise PolicyError(source, [_problem(err) for err in e.errors()]) from None


def load_policy(path: str | Path) -> Policy:
    """Read and validate a policy file (``.toml`` as TOML, anything else as YAML)."""
    p = Path(path)
    source = str(p)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as e:
        raise PolicyError(source, [PolicyProblem("", f"cannot read the file: {e.strerror or e}")]) from None
    if p.suffix.lower() == ".toml":
        try:
            data: Any = tomllib.loads(text)
        except tomllib.TOMLDecodeError as e:
            raise PolicyError(source, [PolicyProblem("", f"not valid TOML: {e}")]) from None
    else:
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as e:
            mark = getattr(e, "problem_mark", None)
            where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
            problem = getattr(e, "problem", None) or str(e)
            raise PolicyError(source, [PolicyProblem("", f"not valid YAML{where}: {problem}")]) from None
    return parse_policy(data, source)


def dump_policy(policy: Policy, fmt: Literal["yaml", "json"] = "yaml") -> str:
    """The policy as a YAML (or JSON) document that :func:`load_policy` reads back unchanged."""
    data = policy.to_dict()
    if fmt == "json":
        return json.dumps(data, indent=2) + "\n"
    return yaml.safe_dump(data, sort_keys=False, default_flow_style=False)
