"""``trtspec plan``'s outputs: plan.json, the policy files, PNG plots, a text summary, report.md/.html."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

from trtspec.bench.doc import Doc, fmt
from trtspec.bench.plots import to_png
from trtspec.bench.runner import DEFAULT_DRAFTER
from trtspec.plan.logs import RequestLog
from trtspec.plan.policy import Recommendation, write_policies

FILES = {
    "json": "plan.json",
    "lengths_png": "token_lengths.png",
    "speedup_png": "speedup_by_bucket.png",
    "load_png": "speedup_vs_rate.png",
    "drafters_png": "speedup_by_drafter.png",
    "markdown": "plan.md",
    "html": "plan.html",
}


def lengths_plot(log: RequestLog, current: int, recommended: int | None) -> bytes:
    """Prompt and output token-length distributions, the thresholds marked."""
    fig = Figure(figsize=(11, 3.8))
    ax1, ax2 = fig.subplots(1, 2)
    prompts = np.asarray([r.prompt_tokens for r in log.records])
    outputs = np.asarray([r.output_tokens for r in log.records])
    for ax, values, title in ((ax1, prompts, "prompt (context) tokens"), (ax2, outputs, "output tokens")):
        hi = max(2, int(values.max()) + 1)
        bins = np.unique(np.geomspace(1, hi, num=40).astype(int)) if hi > 64 else np.arange(0, hi + 1)
        ax.hist(values, bins=bins, color="tab:blue", alpha=0.8)
        if hi > 64:
            ax.set_xscale("log")
        ax.set_title(title)
        ax.set_ylabel("requests")
        ax.grid(alpha=0.3)
    ax1.axvline(current, color="tab:red", linestyle="--", label=f"current threshold ({current})")
    if recommended is not None and recommended != current:
        ax1.axvline(max(recommended, 1), color="tab:green", linestyle="-", label=f"recommended ({recommended})")
    ax1.legend(fontsize=8)
    fig.suptitle("Token-length distribution of the logged requests", y=1.02)
    return to_png(fig)


def speedup_plot(plan: dict) -> bytes:
    fig = Figure(figsize=(9, 3.8))
    ax = fig.subplots()
    b = plan["buckets"]
    x = np.arange(len(b))
    ax.bar(x - 0.2, [r["speedup_unloaded"] for r in b], width=0.4, label="Leviathan (unloaded)", color="tab:gray")
    ax.bar(x + 0.2, [r["speedup"] for r in b], width=0.4, label="load-corrected", color="tab:blue")
    ax.axhline(1.0, color="black", linewidth=1)
    ax.axhline(1.0 + plan["threshold"]["min_gain"], color="tab:red", linestyle="--", linewidth=1, label="pays above")
    ax.set_xticks(x, [f"{r['label']}\n({r['share_requests']:.0%})" for r in b], fontsize=8)
    ax.set_xlabel("context tokens (share of requests)")
    ax.set_ylabel("expected speedup")
    ax.set_title(f"Expected speedup by context length (alpha {plan['inputs']['alpha']:.2f}, "
                 f"c {plan['inputs']['c']:.2f}, k {plan['inputs']['k']}, load factor {plan['load']['factor']:.2f})", fontsize=10)
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    return to_png(fig)


def load_plot(plan: dict) -> bytes | None:
    pts = [(p["rate"], p["speedup"]) for p in plan["inputs"]["bench_points"] if p["speedup"]]
    if not pts:
        return None
    pts.sort()
    fig = Figure(figsize=(6, 3.8))
    ax = fig.subplots()
    ax.plot([r for r, _ in pts], [s for _, s in pts], marker="o")
    ax.axhline(1.0, color="black", linewidth=1)
    be = plan["load"]["break_even_rate"]
    if be is not None:
        ax.axvline(be, color="tab:red", linestyle="--", label=f"break-even {be:.2g} req/s")
        ax.legend(fontsize=8)
    if plan["load"]["rate_per_gpu"] is not None:
        ax.axvline(plan["load"]["rate_per_gpu"], color="tab:green", linestyle=":", label="logged rate per GPU")
        ax.legend(fontsize=8)
    ax.set_xscale("log")
    ax.set_xlabel("request rate (req/s)")
    ax.set_ylabel("measured speedup (ms/token off / on)")
    ax.set_title("Measured speedup vs load (bench)", fontsize=10)
    ax.grid(alpha=0.3)
    return to_png(fig)


DRAFTER_HEADERS = ["drafter", "alpha", "c", "k", "acceptance", "speedup (recommended policy)",
                   "speedup (all speculate)", "recommended"]


def compares_drafters(plan: dict) -> bool:
    """Whether ``plan`` was made from bench runs of several drafters (:func:`~trtspec.plan.plan_by_drafter`)."""
    return len(plan.get("by_drafter", {})) > 1


def drafter_rows(plan: dict) -> list[list]:
    """One row per drafter of ``plan["by_drafter"]``, under :data:`DRAFTER_HEADERS`."""
    return [[name, d["alpha"], d["c"], d["k"], f"{d['acceptance_rate']:.1%}", d["speedup_recommended_policy"],
             d["speedup_all_speculate"], d["recommended"]] for name, d in plan["by_drafter"].items()]


def serve_with(plan: dict) -> str:
    """Which drafter to serve with, and how, when the plan compared several."""
    name = next(name for name, d in plan["by_drafter"].items() if d["recommended"])
    if name == DEFAULT_DRAFTER:
        return "serve with the server's default drafter (the runs that named no drafter)"
    return f"serve with drafter {name} (requests send drafter={name}, or spec_decode's default_drafter parameter is {name})"


def text_summary(plan: dict) -> str:
    lg, th, sp, ld, inp = plan["log"], plan["threshold"], plan["speedup"], plan["load"], plan["inputs"]
    rec = plan["policy"]
    lines = [
        f"log {lg['path']}: {lg['requests']} requests"
        + (f", {lg['requests_per_s']:.3g} req/s ({lg['requests_per_day']:,.0f}/day)" if lg["requests_per_s"] else "")
        + f", mean prompt {lg['mean_prompt_tokens']:.0f} / output {lg['mean_output_tokens']:.0f} tokens"
        + (f"; {len(lg['bad_rows'])} bad rows skipped" if lg["bad_rows"] else ""),
        f"inputs: alpha {inp['alpha']:.3f}, c {inp['c']:.3f}, k {inp['k']} ({inp['source']})",
        *_drafter_lines(plan),
        f"load: {fmt(ld['rate_per_gpu'], 3)} req/s per GPU ({ld['rate_source']}), factor {ld['factor']:.3f}"
        + (" (extrapolated beyond the benched rates)" if ld["extrapolated"] else "")
        + (f"; measured speedup falls below 1 at {ld['break_even_rate']:.3g} req/s" if ld["break_even_rate"] else ""),
        f"above the current threshold ({th['current']} tokens): {th['share_requests_above_current']:.1%} of requests, "
        f"{th['share_output_tokens_above_current']:.1%} of output tokens",
        "bucket      requests  tokens  alpha  speedup  load-corrected  pays",
    ]
    for b in plan["buckets"]:
        lines.append(f"{b['label']:<10} {b['share_requests']:>8.1%} {b['share_output_tokens']:>7.1%} {b['alpha']:>6.3f} "
                     f"{b['speedup_unloaded']:>8.3f} {b['speedup']:>15.3f}  {'yes' if b['pays'] else 'no'}")
    lines.append(f"expected overall speedup: current policy {sp['current_policy']:.3f} "
                 f"({sp['current_policy_speculating_share']:.0%} speculate), recommended {sp['recommended_policy']:.3f} "
                 f"({sp['recommended_policy_speculating_share']:.0%} speculate)")
    if rec.threshold is None:
        lines.append("recommendation: speculation does not pay at this load: keep it off (rollout mode off)")
    else:
        where = "every request" if rec.threshold == 0 else f"above {rec.threshold} context tokens"
        lines.append(f"recommendation: speculate {where}, controller {rec.controller} "
                     f"(k {rec.k}), rollout offline_only -> canary 5% -> full")
    if compares_drafters(plan):
        lines.append(f"drafter: {serve_with(plan)}")
    roi = plan["roi"]
    if roi:
        money = f", {fmt(roi['saved_per_day'], 2)}/day saved at {roi['gpu_price_per_hour']:g}/GPU-hour" if roi["saved_per_day"] is not None else ""
        lines.append(f"ROI: {roi['gpu_hours_per_day_off']:.2f} -> {roi['gpu_hours_per_day_on']:.2f} GPU-hours/day "
                     f"(saved {roi['saved_gpu_hours_per_day']:.2f}){money}; {roi['tokens_per_s']:.1f} tokens/s per GPU ({roi['tokens_per_s_source']})")
    else:
        lines.append("ROI: unknown tokens/s per GPU (pass --tokens-per-s or a bench result without errors)")
    return "\n".join(lines)


def _drafter_lines(plan: dict) -> list[str]:
    """The by-drafter table of the text summary; none with a single drafter."""
    if not compares_drafters(plan):
        return []
    lines = ["by drafter  alpha      c   k  acceptance  speedup (recommended policy)  (all speculate)"]
    for name, alpha, c, k, acc, sp_rec, sp_all, rec in drafter_rows(plan):
        lines.append(f"{name:<10} {alpha:>6.3f} {c:>6.3f} {k:>3} {acc:>11} {sp_rec:>29.3f} {sp_all:>16.3f}"
                     + ("  <- recommended" if rec else ""))
    return lines


def drafters_plot(plan: dict) -> bytes:
    """Each drafter's expected speedup under its recommended policy and with every request speculating,
    its acceptance over the bars; the drafter to serve with drawn solid."""
    names = list(plan["by_drafter"])
    d = [plan["by_drafter"][n] for n in names]
    fig = Figure(figsize=(max(5, 1.6 * len(names) + 2), 3.8))
    ax = fig.subplots()
    x = np.arange(len(names))
    rec = ax.bar(x - 0.2, [r["speedup_recommended_policy"] for r in d], width=0.4, color="tab:blue",
                 label="recommended policy")
    ax.bar(x + 0.2, [r["speedup_all_speculate"] for r in d], width=0.4, color="tab:gray",
           label="every request speculates")
    for bar, r in zip(rec, d):
        bar.set_alpha(1.0 if r["recommended"] else 0.45)
    top = max([1.0] + [max(r["speedup_recommended_policy"], r["speedup_all_speculate"]) for r in d])
    for i, r in enumerate(d):
        ax.text(i, top * 1.03, f"acc {r['acceptance_rate']:.0%}, c {r['c']:.2f}", ha="center", fontsize=8)
    ax.axhline(1.0, color="black", linewidth=1)
    ax.set_ylim(0, top * 1.15)
    ax.set_xticks(x, [f"{n}\n(serve with)" if r["recommended"] else n for n, r in zip(names, d)], fontsize=8)
    ax.set_ylabel("expected overall speedup")
    ax.set_title("Expected speedup by drafter (bench runs grouped by drafter)", fontsize=10)
    ax.legend(fontsize=8, loc="lower right")
    ax.grid(axis="y", alpha=0.3)
    return to_png(fig)


def build_doc(plan: dict, images: dict[str, bytes], policy_files: dict[str, str]) -> Doc:
    """The report: the summary, the traffic, drafters compared, expected speedup, ROI, the policy."""
    doc = Doc("trtspec plan")
    doc.pre(text_summary(plan))
    _traffic_section(doc, plan, images)
    if compares_drafters(plan):
        doc.h2("By drafter")
        doc.p("The bench runs grouped by the drafter their speculating arms sent (trtspec bench --drafter; "
              "default: none named); each drafter planned with its own alpha, c, k and load points. The plan below "
              f"is the one with the highest overall speedup under its recommended policy: {serve_with(plan)}.")
        doc.table(DRAFTER_HEADERS, drafter_rows(plan), digits=3)
        doc.image("Expected speedup by drafter", images["drafters_png"])
    _speedup_section(doc, plan, images)
    _roi_section(doc, plan["roi"])
    _policy_section(doc, plan["policy"], policy_files)
    return doc


def _traffic_section(doc: Doc, plan: dict, images: dict[str, bytes]) -> None:
    """The log read: requests, rows left out, lengths, the share above the current threshold."""
    lg, th = plan["log"], plan["threshold"]
    doc.h2("Traffic")
    doc.p(f"{lg['requests']} requests from {lg['path']} ({lg['format']}) over {lg['span_s'] / 3600:.2f} h; "
          f"priorities {', '.join(f'{k} {v}' for k, v in sorted(lg['by_priority'].items()))}.")
    if lg["bad_rows"]:
        doc.p("Rows left out (--skip-bad-rows):")
        doc.table(["line", "problem"], [[b["line"], b["message"]] for b in lg["bad_rows"][:50]])
    doc.image("Token-length distribution", images["lengths_png"])
    doc.p(f"Above the current threshold ({th['current']} context tokens): {th['share_requests_above_current']:.1%} "
          f"of requests, {th['share_output_tokens_above_current']:.1%} of output tokens.")


def _speedup_section(doc: Doc, plan: dict, images: dict[str, bytes]) -> None:
    """Leviathan's speedup by bucket, load-corrected, the bench points, overall by policy."""
    sp, ld, inp = plan["speedup"], plan["load"], plan["inputs"]
    doc.h2("Expected speedup")
    doc.p(f"Leviathan et al. 2023 (Thm 3.8): speedup = (1 - alpha^(k+1)) / ((1 - alpha)(k c + 1)), with alpha "
          f"{inp['alpha']:.3f}, c {inp['c']:.3f} (effective: verify cost folded in), k {inp['k']} from {inp['source']}; "
          f"times the load factor {ld['factor']:.3f} at {fmt(ld['rate_per_gpu'], 3)} req/s per GPU.")
    doc.table(["bucket", "requests", "share", "output tokens share", "alpha", "Leviathan", "load-corrected", "pays"],
              [[b["label"], b["requests"], f"{b['share_requests']:.1%}", f"{b['share_output_tokens']:.1%}",
                f"{b['alpha']:.3f} ({b['alpha_source']})", b["speedup_unloaded"], b["speedup"], b["pays"]]
               for b in plan["buckets"]], digits=3)
    doc.image("Expected speedup by bucket", images["speedup_png"])
    if "load_png" in images:
        doc.table(["bench", "rate req/s", "measured speedup", "errors / sent"],
                  [[p["path"], p["rate"], p["speedup"], f"{p['errors']} / {p['sent']}"] for p in inp["bench_points"]],
                  digits=3)
        doc.image("Measured speedup vs request rate", images["load_png"])
    doc.p(f"Overall (token-weighted): current policy {sp['current_policy']:.3f}, recommended {sp['recommended_policy']:.3f}, "
          f"everything speculating {sp['all_speculate']:.3f}.")


def _roi_section(doc: Doc, roi: dict | None) -> None:
    doc.h2("ROI")
    if not roi:
        doc.p("Not computed: the tokens/s one GPU generates is unknown (--tokens-per-s, or a bench result without errors).")
        return
    doc.table(["", "value"], [
        ["tokens/s per GPU (speculation off)", roi["tokens_per_s"]],
        ["GPU-hours/day without speculation", roi["gpu_hours_per_day_off"]],
        ["GPU-hours/day with the recommended policy", roi["gpu_hours_per_day_on"]],
        ["GPU-hours/day saved", roi["saved_gpu_hours_per_day"]],
        ["saved per day", roi["saved_per_day"]],
        ["saved per year", roi["saved_per_year"]],
    ], digits=2)


def _policy_section(doc: Doc, rec: Recommendation, policy_files: dict[str, str]) -> None:
    """The recommended policy in words, and each rollout stage's file."""
    doc.h2("Recommended policy")
    if rec.threshold is None:
        doc.p("Speculation does not pay here: policy.yaml sets rollout mode off.")
    else:
        where = "every request" if rec.threshold == 0 else f"above {rec.threshold} context tokens"
        doc.p(f"Speculate {where}; draft-length controller {rec.controller} (k {rec.k}, "
              f"k_max {rec.k_max}). Roll out in stages: deploy policy.yaml (offline_only: batch jobs only), then "
              "policy.canary.yaml (5% of requests), then policy.full.yaml, promoting while the fallback budget holds "
              "and the canary's latency is no worse than the control's.")
    for stage, path in policy_files.items():
        doc.p(f"{stage}: {path}")
        doc.pre(Path(path).read_text())


def write_plan(plan: dict, log: RequestLog, out_dir: str | Path) -> dict[str, str]:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    rec = plan["policy"]
    policy_files = write_policies(rec, out)
    images = {
        "lengths_png": lengths_plot(log, plan["threshold"]["current"], rec.threshold),
        "speedup_png": speedup_plot(plan),
    }
    lp = load_plot(plan)
    if lp is not None:
        images["load_png"] = lp
    if compares_drafters(plan):
        images["drafters_png"] = drafters_plot(plan)
    paths = {k: out / v for k, v in FILES.items() if k in ("json", "markdown", "html") or k in images}
    for k, png in images.items():
        paths[k].write_bytes(png)
    paths["json"].write_text(json.dumps(plan_json(plan, policy_files), indent=1) + "\n")
    doc = build_doc(plan, images, policy_files)
    paths["markdown"].write_text(doc.to_markdown())
    paths["html"].write_text(doc.to_html())
    files = {k: str(v) for k, v in paths.items()}
    files.update({f"policy_{stage}": p for stage, p in policy_files.items()})
    return files


def plan_json(plan: dict, policy_files: dict[str, str] | None = None) -> dict:
    out = dict(plan)
    out["policy"] = plan["policy"].to_dict() | {"files": policy_files or {}}
    return out
