#!/usr/bin/env python
"""Core benchmark: the draft-verify loop against the target alone and against
Hugging Face assisted generation, on the demo pair, in ONE run.

    python scripts/bench_core.py                  # 24 prompts x 64 tokens, table + JSON
    python scripts/bench_core.py --prompts 8 --max-tokens 48 --json-out results/core.json
    python scripts/bench_core.py --draft-precision int8   # the INT8 draft (default: the demo's, int4 where it runs well)

Prints, side by side (all greedy, same prompts, same token budget):
  - target alone (our runtime, fp32), our speculative loop (the demo's draft: INT4 where it runs
    well, as ``trtspec demo`` drafts, else INT8; or the one ``--draft-precision`` names; k fixed),
  - HF ``generate()`` target alone and HF ``generate(assistant_model=...)`` with the
    same two weight sets (HF runs the draft's weights as stored, in bf16: the INT8
    draft's dequantized, or with ``--draft-precision int4`` the float target's),
tokens/s, speedup over our target alone, acceptance rate and per position, the
measured cost ratio c = draft step / target step, the verify-cost curve V(k)/V(1),
Leviathan's predicted speedup and our efficiency = measured / predicted.

Numbers vary run to run by a few percent on a shared 2-core machine; compare
within one run.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

from trtspec.bench.inprocess import cpu_name, run_hf, write_json
from trtspec.data import benchmark_prompts
from trtspec.runtime.demo import prepare_demo
from trtspec.runtime.pair import load_pair
from trtspec.decoding import FixedDraftLength, GenerationRequest, SpecStats, StopCriteria


def leviathan_speedup(alpha: float, k: int, c: float, verify_ratio: float = 1.0) -> float:
    """Expected speedup of speculative decoding (Leviathan et al. 2023, Thm 3.8):
    E[tokens per iteration] = (1 - alpha^(k+1)) / (1 - alpha), cost per iteration
    = k * c + V, in units of one target step (V = 1 in the paper; ``verify_ratio``
    plugs in the measured cost of verifying k + 1 tokens in one pass)."""
    if alpha >= 1.0:
        tokens = k + 1.0
    else:
        tokens = (1 - alpha ** (k + 1)) / (1 - alpha)
    return tokens / (k * c + verify_ratio)


def alpha_mle(stats: SpecStats, k: int) -> float:
    """Per-token acceptance probability alpha under the paper's i.i.d. model:
    accepted / (accepted + rejections), a rejection being an iteration that
    stopped before accepting all k drafts (maximum-likelihood estimate)."""
    full = stats.bonus_tokens
    rejections = stats.iterations - full
    return stats.accepted_tokens / max(1, stats.accepted_tokens + rejections)


def median_time(fn, reps: int) -> float:
    fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def step_costs(pair, context: int, reps: int, kmax: int = 8) -> dict:
    """Forward-pass times at a fixed context: target k = 1..kmax new tokens, draft 1 token."""
    ids = list(range(100, 100 + context))
    out: dict = {"context": context}

    def timed(lm, n):
        s = lm.new_session()
        s.forward(ids, 0)

        def run():
            s.truncate(context)
            s.forward(ids[:n], 1 if n == 1 else n)

        t = median_time(run, reps)
        s.close()
        return t

    v = {n: timed(pair.target.lm, n) for n in range(1, kmax + 2)}
    out["target_step_s"] = v[1]
    out["draft_step_s"] = timed(pair.draft.lm, 1)
    out["c"] = out["draft_step_s"] / out["target_step_s"]
    out["verify_ratio"] = {n: v[n] / v[1] for n in v}  # V(n)/V(1), n tokens in one pass
    return out


def run_ours(pair, prompts_ids, max_tokens, eos, k) -> dict:
    dec = pair.decoder()
    total = SpecStats()
    outs = []
    elapsed = 0.0
    for ids in prompts_ids:
        req = GenerationRequest(tuple(ids), StopCriteria(max_tokens, eos_token_ids=eos))
        t0 = time.perf_counter()
        r = dec.generate(req, FixedDraftLength(k))
        elapsed += time.perf_counter() - t0
        outs.append(r.token_ids)
        total.merge(r.stats)
    return {"outputs": outs, "time_s": elapsed, "tokens": total.emitted_tokens, "stats": total}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", type=int, default=24, help="how many of the fixed prompts (<= 24)")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--k", type=int, default=5, help="draft length of our loop")
    ap.add_argument("--sweep", default="2,3,4,5,6,8", help="k values for the sweep (on the first 6 prompts)")
    ap.add_argument("--no-hf", action="store_true", help="skip the Hugging Face runs")
    ap.add_argument("--draft-precision", choices=("auto", "int8", "int4"), default="auto",
                    help="auto: the demo's draft (int4 where it runs well, as trtspec demo; else int8); int8: the "
                         "demo's INT8 draft; int4: the target's float weights (the GGUF's Q4_1, dequantized) with "
                         "the layers' matrices in int4 (CPU), embedding and head in int8")
    ap.add_argument("--json-out", type=Path, default=None)
    args = ap.parse_args()

    torch.manual_seed(0)
    say = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731
    paths = prepare_demo(progress=say)
    args.draft_precision = paths.draft_precision(args.draft_precision)
    draft_src = paths.draft_at(args.draft_precision)
    pair = load_pair(paths.target, draft_src, draft_precision=args.draft_precision, progress=say)
    tok = pair.target.tokenizer
    eos = tok.eos_token_ids()
    prompts = benchmark_prompts()[: args.prompts]
    prompts_ids = [tok.encode_prompt(p) for p in prompts]
    say(f"{len(prompts)} prompts, {args.max_tokens} new tokens each, threads={torch.get_num_threads()}")

    # warm-up (allocators, kernels' first-call costs)
    run_ours(pair, prompts_ids[:1], 8, eos, args.k)

    say("our runtime: target alone")
    base = run_ours(pair, prompts_ids, args.max_tokens, eos, 0)
    say(f"our runtime: speculative, k={args.k}")
    spec = run_ours(pair, prompts_ids, args.max_tokens, eos, args.k)
    say("step costs and the verify-cost curve")
    ctx = int(statistics.median(len(i) for i in prompts_ids)) + args.max_tokens // 2
    costs = step_costs(pair, ctx, reps=9)

    rows = []
    tps_base = base["tokens"] / base["time_s"]

    def row(name, r, extra=None):
        tps = r["tokens"] / r["time_s"]
        d = {"system": name, "tokens": r["tokens"], "time_s": round(r["time_s"], 3), "tokens_per_s": round(tps, 2),
             "speedup_vs_our_target": round(tps / tps_base, 3)}
        d.update(extra or {})
        rows.append(d)
        return d

    row("ours: target alone (fp32)", base)
    s = spec["stats"]
    alpha = alpha_mle(s, args.k)
    pred = leviathan_speedup(alpha, args.k, costs["c"])
    pred_v = leviathan_speedup(alpha, args.k, costs["c"], costs["verify_ratio"][args.k + 1])
    measured = (spec["tokens"] / spec["time_s"]) / tps_base
    identical = sum(a == b for a, b in zip(spec["outputs"], base["outputs"]))
    row(f"ours: speculative k={args.k} ({args.draft_precision.upper()} draft)", spec, {
        "acceptance_rate": round(s.acceptance_rate or 0, 4),
        "alpha_mle": round(alpha, 4),
        "mean_acceptance_length": round(s.mean_acceptance_length or 0, 3),
        "acceptance_per_position": [round(a / d, 3) for a, d in zip(s.accepted_per_position, s.drafted_per_position)],
        "identical_to_target_alone": f"{identical}/{len(prompts)}",
    })

    hf = {}
    if not args.no_hf:
        from transformers import AutoModelForCausalLM
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
        say("HF: loading target (fp32) and assistant (draft weights, bf16)")
        target_hf = AutoModelForCausalLM.from_pretrained(str(paths.target), dtype=torch.float32).eval()
        draft_hf = AutoModelForCausalLM.from_pretrained(str(draft_src), dtype=torch.bfloat16).eval()
        run_hf(target_hf, None, prompts_ids[:1], 8, eos)
        say("HF: target alone")
        hf["target"] = run_hf(target_hf, None, prompts_ids, args.max_tokens, eos)
        row("HF: target alone (fp32)", hf["target"])
        for label, kw in (
            ("HF: assisted, library defaults", {}),
            (f"HF: assisted, constant k={args.k}", {"num_assistant_tokens": args.k, "num_assistant_tokens_schedule": "constant", "assistant_confidence_threshold": 0.0}),
        ):
            say(label)
            r = run_hf(target_hf, draft_hf, prompts_ids, args.max_tokens, eos, kw)
            same = sum(a == b for a, b in zip(r["outputs"], hf["target"]["outputs"]))
            row(label, r, {"identical_to_hf_target_alone": f"{same}/{len(prompts)}"})
            hf[label] = r

    sweep = []
    ks = [int(x) for x in args.sweep.split(",") if x.strip()]
    if ks:
        say(f"k sweep on {min(6, len(prompts))} prompts: {ks}")
        sub = prompts_ids[:6]
        b = run_ours(pair, sub, args.max_tokens, eos, 0)
        tb = b["tokens"] / b["time_s"]
        for k in ks:
            r = run_ours(pair, sub, args.max_tokens, eos, k)
            a = alpha_mle(r["stats"], k)
            m = (r["tokens"] / r["time_s"]) / tb
            p = leviathan_speedup(a, k, costs["c"])
            pv = leviathan_speedup(a, k, costs["c"], costs["verify_ratio"][k + 1])
            sweep.append({"k": k, "speedup": round(m, 3), "alpha": round(a, 3), "predicted_leviathan": round(p, 3),
                          "predicted_with_V": round(pv, 3), "efficiency": round(m / p, 3),
                          "efficiency_vs_V": round(m / pv, 3), "identical": r["outputs"] == b["outputs"]})

    summary = {
        "prompts": len(prompts),
        "max_tokens": args.max_tokens,
        "k": args.k,
        "draft_precision": args.draft_precision,
        "threads": torch.get_num_threads(),
        "cpu": cpu_name(),
        "weights_bytes": {"target": pair.target.weight_bytes, "draft": pair.draft.weight_bytes},
        "step_costs": costs,
        "speedup": round(measured, 3),
        "alpha_mle": round(alpha, 4),
        "predicted_speedup_leviathan": round(pred, 3),
        "predicted_speedup_with_measured_verify_cost": round(pred_v, 3),
        "efficiency": round(measured / pred, 3),
        "efficiency_vs_verify_aware_prediction": round(measured / pred_v, 3),
        "rows": rows,
        "k_sweep": sweep,
    }
    write_json(args.json_out, summary)
    _print_table(summary)
    return 0


def _print_table(s: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    con = Console()
    t = Table(title=f"Demo pair, {s['prompts']} prompts x {s['max_tokens']} tokens, greedy ({s['cpu']}, {s['threads']} threads)")
    for col in ("system", "tokens/s", "speedup", "acceptance", "identical"):
        t.add_column(col)
    for r in s["rows"]:
        acc = r.get("acceptance_rate")
        ident = r.get("identical_to_target_alone") or r.get("identical_to_hf_target_alone") or ""
        t.add_row(r["system"], f"{r['tokens_per_s']:.1f}", f"{r['speedup_vs_our_target']:.2f}x",
                  f"{acc:.1%}" if acc is not None else "", ident)
    con.print(t)
    c = s["step_costs"]
    spec_row = s["rows"][1]
    con.print(f"acceptance per position: {spec_row['acceptance_per_position']}  (position i counts only when 0..i-1 were accepted)")
    con.print(f"target step {c['target_step_s'] * 1e3:.1f} ms, draft step {c['draft_step_s'] * 1e3:.1f} ms -> c = {c['c']:.3f} (context {c['context']})")
    con.print("verify cost V(n)/V(1), n tokens in one target pass: " + "  ".join(f"{n}:{v:.2f}" for n, v in c["verify_ratio"].items()))
    con.print(f"alpha (MLE) {s['alpha_mle']:.3f}; Leviathan predicted {s['predicted_speedup_leviathan']:.2f}x, "
              f"measured {s['speedup']:.2f}x -> efficiency {s['efficiency']:.2f}; "
              f"with the measured verify cost predicted {s['predicted_speedup_with_measured_verify_cost']:.2f}x -> efficiency {s['efficiency_vs_verify_aware_prediction']:.2f}")
    if s["k_sweep"]:
        t2 = Table(title="k sweep (first 6 prompts)")
        for col in ("k", "speedup", "alpha", "predicted (Leviathan)", "predicted (with V)", "efficiency", "eff. vs V", "identical"):
            t2.add_column(col)
        for r in s["k_sweep"]:
            t2.add_row(str(r["k"]), f"{r['speedup']:.2f}x", f"{r['alpha']:.3f}", f"{r['predicted_leviathan']:.2f}x",
                       f"{r['predicted_with_V']:.2f}x", f"{r['efficiency']:.2f}", f"{r['efficiency_vs_V']:.2f}", str(r["identical"]))
        con.print(t2)


if __name__ == "__main__":
    raise SystemExit(main())
