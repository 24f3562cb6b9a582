"""``trtspec bench``: load a running server with speculation on and off, report the difference.

Client side only: talks to the server through :mod:`trtspec.serving.client`'s
helpers and its metrics port; never imports the runtimes. See
``docs/bench_plan.md``.

    from trtspec.bench import BenchConfig, run_bench, write_report
"""

from trtspec.bench.records import RequestRecord, categorize
from trtspec.bench.report import load_result, text_summary, write_report
from trtspec.bench.runner import BenchConfig, BenchResult, Progress, run_bench
from trtspec.bench.workload import (
    ArmSplit,
    BenchError,
    OutputLength,
    Prompt,
    WorkloadError,
    builtin_prompts,
    load_prompts,
)

__all__ = [
    "ArmSplit",
    "BenchConfig",
    "BenchError",
    "BenchResult",
    "OutputLength",
    "Progress",
    "Prompt",
    "RequestRecord",
    "WorkloadError",
    "builtin_prompts",
    "categorize",
    "load_prompts",
    "load_result",
    "run_bench",
    "text_summary",
    "write_report",
]
