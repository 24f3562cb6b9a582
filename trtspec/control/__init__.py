"""The control plane: whether and how much to speculate, per request and per iteration.

Pure Python over :mod:`trtspec.decoding`; the clock is injected. The serving layer
talks to :class:`SpeculationGovernor` (see :mod:`trtspec.control.governor`);
``docs/control.md`` documents the policy file and every rule.
"""

from trtspec.control.admission import Admission
from trtspec.control.breaker import BreakerListener, BreakerSnapshot, BreakerState, CircuitBreaker, Transition
from trtspec.control.clock import Clock, FakeClock
from trtspec.control.config import (
    ControllerKind,
    Policy,
    Priority,
    RolloutMode,
    dump_policy,
    load_policy,
    parse_policy,
)
from trtspec.control.controllers import (
    DraftLengthController,
    HeuristicController,
    StaticController,
    StepController,
)
from trtspec.control.errors import PolicyError, PolicyProblem
from trtspec.control.fallback import FallbackGuard
from trtspec.control.goodput import GoodputController, GoodputModel
from trtspec.control.governor import GovernorSnapshot, RequestControl, SpeculationGovernor, make_controller
from trtspec.control.rates import RollingRejection, rejection_rate
from trtspec.control.rollout import Rollout, RolloutStatus
from trtspec.control.router import Router
from trtspec.control.types import Reason, RequestInfo, RouteDecision, Speculation

__all__ = [
    "Admission",
    "BreakerListener",
    "BreakerSnapshot",
    "BreakerState",
    "CircuitBreaker",
    "Clock",
    "ControllerKind",
    "DraftLengthController",
    "FakeClock",
    "FallbackGuard",
    "GoodputController",
    "GoodputModel",
    "GovernorSnapshot",
    "HeuristicController",
    "Policy",
    "PolicyError",
    "PolicyProblem",
    "Priority",
    "Reason",
    "RequestControl",
    "RequestInfo",
    "RolloutMode",
    "Rollout",
    "RolloutStatus",
    "RollingRejection",
    "RouteDecision",
    "Router",
    "Speculation",
    "SpeculationGovernor",
    "StaticController",
    "StepController",
    "Transition",
    "dump_policy",
    "load_policy",
    "make_controller",
    "parse_policy",
    "rejection_rate",
]
