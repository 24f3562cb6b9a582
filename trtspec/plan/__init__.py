"""``trtspec plan``: from historical request logs and bench measurements to expected speedup, ROI
and a recommended policy file. Client side only; see ``docs/bench_plan.md``.

    from trtspec.plan import PlanConfig, read_log, resolve_inputs, plan_by_drafter, write_plan
"""

from trtspec.plan.logs import LogParseError, LogProblem, LogRecord, RequestLog, read_log
from trtspec.plan.planner import (
    PlanConfig,
    PlanError,
    SpecInputs,
    bench_inputs,
    bench_inputs_by_drafter,
    make_plan,
    plan_by_drafter,
    resolve_inputs,
)
from trtspec.plan.report import plan_json, text_summary, write_plan

__all__ = [
    "LogParseError",
    "LogProblem",
    "LogRecord",
    "PlanConfig",
    "PlanError",
    "RequestLog",
    "SpecInputs",
    "bench_inputs",
    "bench_inputs_by_drafter",
    "make_plan",
    "plan_by_drafter",
    "plan_json",
    "read_log",
    "resolve_inputs",
    "text_summary",
    "write_plan",
]
