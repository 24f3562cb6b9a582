"""Plan arithmetic on a five-request log, against values computed by hand (working in the comments)."""

from __future__ import annotations

from pathlib import Path

import pytest

from trtspec.control import RolloutMode, load_policy
from trtspec.plan import (
    PlanConfig,
    PlanError,
    bench_inputs,
    bench_inputs_by_drafter,
    make_plan,
    plan_by_drafter,
    read_log,
    text_summary,
    write_plan,
)
from trtspec.plan.model import acceptance_rate, alpha_from_rate
from trtspec.plan.planner import explicit_inputs

S = (1 - 0.8**5) / 0.2 / (4 * 0.1 + 1)  # Leviathan at alpha 0.8, k 4, c 0.1: 3.3616 / 1.4 = 2.40114


def plan_for(log_path: Path, alpha=0.8, c=0.1, k=4, **cfg):
    log = read_log(log_path)
    return log, make_plan(log, explicit_inputs(alpha, c, k), PlanConfig(**cfg))


def test_log_figures(small_log: Path) -> None:
    _, plan = plan_for(small_log)
    lg = plan["log"]
    assert lg["requests"] == 5
    assert lg["span_s"] == 40
    assert lg["requests_per_s"] == pytest.approx(0.1)  # 4 gaps over 40 s
    assert lg["requests_per_day"] == pytest.approx(8640)
    assert lg["mean_output_tokens"] == pytest.approx(200)  # 1000 / 5
    assert lg["mean_prompt_tokens"] == pytest.approx(100)  # 500 / 5
    assert lg["by_priority"] == {"normal": 3, "high": 1, "low": 1}


def test_buckets_and_threshold_shares(small_log: Path) -> None:
    _, plan = plan_for(small_log)
    by = {b["label"]: b for b in plan["buckets"]}
    assert [b["label"] for b in plan["buckets"]] == ["0-32", "33-64", "65-128", "129-256", "257-512", "513-1024",
                                                     "1025-2048", "2049+"]
    assert (by["0-32"]["requests"], by["33-64"]["requests"], by["65-128"]["requests"], by["257-512"]["requests"]) == (1, 2, 1, 1)
    assert by["33-64"]["share_requests"] == pytest.approx(0.4)
    assert by["33-64"]["share_output_tokens"] == pytest.approx(0.4)  # 400 / 1000
    assert by["257-512"]["share_output_tokens"] == pytest.approx(0.4)
    for b in plan["buckets"]:
        assert b["speedup_unloaded"] == pytest.approx(S) and b["speedup"] == pytest.approx(S)  # no bench: factor 1
    th = plan["threshold"]
    assert th["current"] == 64  # the default policy's long_context rule
    assert th["share_requests_above_current"] == pytest.approx(0.4)  # 100 and 300 tokens
    assert th["share_output_tokens_above_current"] == pytest.approx(0.5)  # (100 + 400) / 1000


def test_overall_speedup_and_roi(small_log: Path) -> None:
    _, plan = plan_for(small_log, tokens_per_s=100.0, gpu_price=3.0)
    sp = plan["speedup"]
    # Default policy: >64 tokens speculate (rows 3, 4); else high -> target only (row 2); else speculate (1, 5).
    # Time with speculation: (100 + 100 + 400 + 200) / S + 200; overall = 1000 / that.
    assert sp["current_policy"] == pytest.approx(1000 / (800 / S + 200))
    assert sp["current_policy_speculating_share"] == pytest.approx(0.8)
    # Everything pays (S > 1.05): threshold 0, everything speculates.
    assert plan["threshold"]["recommended"] == 0
    assert sp["recommended_policy"] == pytest.approx(S)
    roi = plan["roi"]
    # 8640 requests/day x 200 tokens / 100 tokens/s / 3600 = 4.8 GPU-hours/day; with speculation 4.8 / S
    assert roi["gpu_hours_per_day_off"] == pytest.approx(4.8)
    assert roi["gpu_hours_per_day_on"] == pytest.approx(4.8 / S)
    assert roi["saved_gpu_hours_per_day"] == pytest.approx(4.8 - 4.8 / S)
    assert roi["saved_per_day"] == pytest.approx((4.8 - 4.8 / S) * 3.0)
    assert roi["saved_per_year"] == pytest.approx((4.8 - 4.8 / S) * 3.0 * 365)
    assert plan["load"]["rate_per_gpu"] == pytest.approx(0.1)  # 4.8 h/day fits on one GPU


def test_nothing_pays_gives_a_policy_that_keeps_speculation_off(small_log: Path, tmp_path: Path) -> None:
    log, plan = plan_for(small_log, alpha=0.5, c=0.5, k=2, tokens_per_s=100.0)  # 0.875x everywhere
    assert all(not b["pays"] for b in plan["buckets"])
    assert plan["threshold"]["recommended"] is None
    assert plan["speedup"]["recommended_policy"] == pytest.approx(1.0)
    assert plan["roi"]["saved_gpu_hours_per_day"] == pytest.approx(0.0)
    # the current (default) policy speculates 80% of traffic at 0.875x: 1000 / (800 / 0.875 + 200)
    assert plan["speedup"]["current_policy"] == pytest.approx(1000 / (800 / 0.875 + 200))
    files = write_plan(plan, log, tmp_path / "out")
    policy = load_policy(files["policy_off"])
    assert policy.rollout.mode is RolloutMode.OFF
    assert policy.routing.rules == [] and policy.routing.default_action.value == "target_only"


def test_recommended_policy_files_load_and_roll_out_in_stages(small_log: Path, tmp_path: Path) -> None:
    log, plan = plan_for(small_log)
    files = write_plan(plan, log, tmp_path / "out")
    stages = {s: load_policy(files[f"policy_{s}"]) for s in ("offline_only", "canary", "full")}
    assert Path(files["policy_offline_only"]).name == "policy.yaml"  # the one to deploy first
    assert stages["offline_only"].rollout.mode is RolloutMode.OFFLINE_ONLY
    assert stages["canary"].rollout.mode is RolloutMode.CANARY
    assert stages["canary"].rollout.canary_fraction == pytest.approx(0.05)
    assert stages["full"].rollout.mode is RolloutMode.FULL
    # alpha 0.8, c 0.1: k* = 6 (see test_model), one alpha for every bucket -> static
    dl = stages["full"].draft_length
    assert (dl.controller.value, dl.static.k, dl.k_max) == ("static", 6, 8)
    assert stages["full"].routing.default_action.value == "speculate"
    for kind in ("json", "markdown", "html", "lengths_png", "speedup_png"):
        assert Path(files[kind]).stat().st_size > 0


def test_bench_inputs_alpha_c_k_and_load_correction(small_log: Path, make_bench) -> None:
    inputs = bench_inputs([("a.json", make_bench(1.0, 1.2)), ("b.json", make_bench(5.0, 0.9))])
    assert inputs.k == 4
    assert inputs.acceptance_rate == pytest.approx(300 / 400)  # pooled over both runs: (60 + 90) x 2 / 400
    assert acceptance_rate(inputs.alpha, 4) == pytest.approx(0.75)
    assert inputs.c == pytest.approx(0.5)
    assert inputs.alpha_by_bucket == {"33-64": pytest.approx(alpha_from_rate(0.6, 4)),
                                      "65-128": pytest.approx(alpha_from_rate(0.9, 4))}
    log = read_log(small_log)
    # at 3 req/s per GPU the measured speedup is 1.05 (between 1.2 at 1 and 0.9 at 5): factor 0.875
    plan = make_plan(log, inputs, PlanConfig(rate_per_gpu=3.0))
    assert plan["load"]["factor"] == pytest.approx(0.875)
    assert plan["load"]["break_even_rate"] == pytest.approx(1 + 4 * 0.2 / 0.3)
    by = {b["label"]: b for b in plan["buckets"]}
    lev = lambda a: (1 - a**5) / (1 - a) / (4 * 0.5 + 1)  # noqa: E731
    assert by["33-64"]["alpha_source"] == "bucket"
    assert by["33-64"]["speedup"] == pytest.approx(lev(alpha_from_rate(0.6, 4)) * 0.875)
    assert by["0-32"]["alpha_source"] == "overall"
    assert by["0-32"]["speedup"] == pytest.approx(lev(inputs.alpha) * 0.875)
    # the two measured alphas differ by more than 0.1: the adaptive controller
    assert plan["policy"].controller == "goodput"


def test_plan_by_drafter_picks_the_better_drafter_and_reports_both(small_log: Path, make_bench) -> None:
    # model accepts 30 + 40 of 200 drafted, ngram 60 + 90: same c (0.5) and k (4), listed second
    results = [("m.json", make_bench(1.0, 1.2, drafter="model", accepted=(30, 40))),
               ("n.json", make_bench(1.0, 1.2, drafter="ngram"))]
    inputs = bench_inputs_by_drafter(results)
    assert list(inputs) == ["model", "ngram"]
    assert inputs["model"].acceptance_rate == pytest.approx(70 / 200)
    assert inputs["ngram"].acceptance_rate == pytest.approx(150 / 200)
    assert inputs["ngram"].source == "bench: n.json"  # each drafter from its own runs
    log = read_log(small_log)
    cfg = PlanConfig(rate_per_gpu=1.0)
    plan = plan_by_drafter(log, inputs, cfg)
    ngram, model = make_plan(log, inputs["ngram"], cfg), make_plan(log, inputs["model"], cfg)
    assert model["speedup"]["recommended_policy"] < ngram["speedup"]["recommended_policy"]
    assert plan["inputs"] == ngram["inputs"] and plan["speedup"] == ngram["speedup"]  # the plan is ngram's
    assert plan["by_drafter"] == {
        name: {"alpha": pytest.approx(inputs[name].alpha), "c": pytest.approx(0.5), "k": 4,
               "acceptance_rate": pytest.approx(inputs[name].acceptance_rate),
               "speedup_recommended_policy": pytest.approx(p["speedup"]["recommended_policy"]),
               "speedup_all_speculate": pytest.approx(p["speedup"]["all_speculate"]),
               "recommended": name == "ngram"}
        for name, p in (("model", model), ("ngram", ngram))
    }
    text = text_summary(plan)
    assert "by drafter" in text and "drafter: serve with drafter ngram" in text
    assert [line.split()[0] for line in text.splitlines() if line.endswith("<- recommended")] == ["ngram"]


def test_results_without_a_drafter_plan_as_before(small_log: Path, make_bench) -> None:
    results = [("a.json", make_bench(1.0, 1.2)), ("b.json", make_bench(5.0, 0.9))]  # no config.drafter: older files
    inputs = bench_inputs_by_drafter(results)
    assert list(inputs) == ["default"]
    log = read_log(small_log)
    cfg = PlanConfig(rate_per_gpu=3.0)
    plan = plan_by_drafter(log, inputs, cfg)
    before = make_plan(log, bench_inputs(results), cfg)
    assert {k: v for k, v in plan.items() if k != "by_drafter"} == before
    assert list(plan["by_drafter"]) == ["default"] and plan["by_drafter"]["default"]["recommended"]
    assert "by drafter" not in text_summary(plan) and "drafter:" not in text_summary(plan)


def test_a_drafter_that_never_drafted_is_named(make_bench) -> None:
    results = [("m.json", make_bench(1.0, 1.2, drafter="model")),
               ("n.json", make_bench(1.0, 1.2, drafter="ngram", drafted=0, accepted=(0, 0)))]
    with pytest.raises(PlanError, match="^drafter ngram: the bench results hold no drafted tokens"):
        bench_inputs_by_drafter(results)
