#!/usr/bin/env python
"""Soak: the highest rate this machine holds, for a long time, plus bursts; nothing may be lost.

    python scripts/soak.py                                   # tiny pair, find the rate, 10 min + bursts
    python scripts/soak.py --pair demo --rate 0.8 --duration 600
    python scripts/soak.py --duration 180 --out results/soak  # what the issue's 10 minutes shrink to here
    python scripts/soak.py --pair tiny-long --long-share 0.1 --rate 2 --duration 120 --prefill-chunk 0

Starts its own tritonserver on the chosen pair (``tiny``: seconds-sized random
models; ``demo``: SmolLM2-135M-Instruct with its INT8 copy, cached by
``trtspec.runtime.demo.prepare_demo``), then:

1. unless ``--rate`` is given, finds the highest rate the server holds with
   ``trtspec bench``'s load generator (open loop, Poisson): rates double from
   ``--start-rate`` while a 20 s run has no error and a p99 latency under
   ``--slo-s`` and a latency that does not keep growing (a queue building up),
   then one bisection step between the last clean and the first unclean rate;
   the soak runs at ``--headroom`` (0.8) times the highest clean rate, so the
   queue a burst leaves behind drains;
2. runs that rate for ``--duration`` seconds while a second generator adds a
   burst of ``--burst-rate`` requests/s (200: what operators test at) for
   ``--burst-s`` seconds every ``--burst-every`` seconds, sampling the server's
   memory (RSS and PSS of the server's process tree from ``/proc``, the models'
   ``trtspec_model_memory_bytes`` from Triton's metrics) every second;
3. checks and prints: every request sent was answered or refused with a clear
   error (sent = answered + refused, client side, and the server counted as
   many requests as the client sent), no stub died (same PIDs, alive), the
   KV-cache sessions all freed afterwards, and memory flat after warm-up (the
   first 20% of the run and the first burst): each stub's RSS grows by at most
   8 MiB; the totals (PSS/RSS of the process tree, the models' memory gauges),
   their slope and the tritonserver process's own growth per request are
   printed and plotted; writes
   ``memory.png`` and ``soak.json`` into ``--out``.

With ``--long-share`` (``tiny-long`` or ``demo`` pair: the context holds them)
that share of the requests carries a long prompt (``--long-tokens``, default
2000-4000 tokens); the run then also checks that no model was reloaded (a
busy model is not a dead one) and prints the TTFT of short requests sent while
a long request was in its prefill, beside that of the others;
``--prefill-chunk`` sets ``spec_decode``'s ``prefill_chunk_tokens`` (0: a
prefill is one call) to compare.

Exit code 0 when every check passes, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from trtspec.bench import ArmSplit, BenchConfig, OutputLength, builtin_prompts, run_bench  # noqa: E402
from trtspec.bench.workload import Prompt, long_prompt_texts  # noqa: E402
from trtspec.bench import memory as mem  # noqa: E402
from trtspec.bench.runner import BenchResult  # noqa: E402
from trtspec.builder.repo import write_model_repo  # noqa: E402
from trtspec.serving import statusfile, stubs  # noqa: E402
from trtspec.serving.launcher import TritonServer  # noqa: E402
from trtspec.testing.tiny import PAIRS, pair_paths  # noqa: E402

STEP_S = 30.0  # seconds per step of the rate search

POLICY = """
draft_length:
  controller: static
  static: {k: 4}
"""


PROMPTS: list[Prompt] = builtin_prompts()  # main() mixes long ones in with --long-share
LONG_FROM = 1000  # prompt tokens from which a request counts as long in the report


def mixed_prompts(target: Path, share: float, tokens: str, max_tokens: int) -> list[Prompt]:
    """The built-in prompts with long ones added so that ``share`` of the draws are long."""
    from trtspec.runtime.tokenizer import Tokenizer

    short = builtin_prompts() * 9
    n_long = round(share / (1 - share) * len(short))
    lo, _, hi = tokens.partition("-")
    lo_n, hi_n = int(lo), int(hi or lo)
    lengths = [lo_n + (hi_n - lo_n) * i // max(1, n_long - 1) for i in range(n_long)]
    texts = long_prompt_texts(Tokenizer.from_dir(target), lengths)
    return short + [Prompt(t, max_tokens=max_tokens) for t in texts]


def ttft_during_prefills(records: list) -> dict:
    """TTFT of short requests sent while a long one was in its prefill (sent, first token not yet
    back), and of the other short ones; p50 / p90 / max in ms."""
    answered = [r for r in records if r.answered and r.ttft_s is not None and r.sent_s is not None]
    longs = [(r.sent_s, r.sent_s + r.ttft_s) for r in answered if r.input_tokens >= LONG_FROM]
    during, other = [], []
    for r in answered:
        if r.input_tokens < LONG_FROM:
            (during if any(a <= r.sent_s < b for a, b in longs) else other).append(r.ttft_s * 1000)

    def q(xs: list[float]) -> dict:
        xs = sorted(xs)
        if not xs:
            return {"n": 0}
        return {"n": len(xs), "p50": round(xs[len(xs) // 2]), "p90": round(xs[int(0.9 * (len(xs) - 1))]),
                "max": round(xs[-1])}

    long_ttft = [b - a for a, b in longs]
    return {"short_during_long_prefill_ms": q(during), "short_otherwise_ms": q(other),
            "long_ttft_ms": q([x * 1000 for x in long_ttft])}


def bench(url: str, rate: float, duration: float, max_tokens: str, timeout_s: float, seed: int, *,
          metrics_url: str | None = None, pid: int | None = None) -> BenchResult:
    cfg = BenchConfig(
        url=url, prompts=PROMPTS, workload_split=ArmSplit.parse("auto"), output=OutputLength.parse(max_tokens),
        rate=rate, duration_s=duration, timeout_s=timeout_s, metrics_url=metrics_url, server_pid=pid,
        memory_interval_s=1.0, seed=seed, probe=False,
    )
    return run_bench(cfg)


def wait_idle(server: TritonServer, expected: int, timeout_s: float) -> int:
    """Wait until the server has ended ``expected`` requests (trtspec_requests_total); the count it reached."""
    deadline = time.monotonic() + timeout_s
    done = 0
    while time.monotonic() < deadline:
        m = mem.try_scrape(server.endpoints.metrics_url)
        done = int(mem.total(m, "trtspec_requests_total") or 0) if m else done
        if done >= expected:
            return done
        time.sleep(0.5)
    return done


def find_rate(server: TritonServer, args: argparse.Namespace) -> tuple[float, list[dict]]:
    rows: list[dict] = []

    def clean_at(rate: float) -> bool:
        r = bench(server.endpoints.grpc, rate, STEP_S, args.max_tokens, args.timeout_s, seed=int(rate * 10))
        o = r.summary["overall"]
        p99 = (o["e2e_ms"].get("p99") or 0) / 1000
        # a queue that keeps growing is not held, however short the step: compare the last third's
        # median latency with the first third's
        recs = sorted((x for x in r.records if x.answered and x.e2e_s is not None), key=lambda x: x.arrival_s)
        third = max(1, len(recs) // 3)
        first, last = (sorted(x.e2e_s for x in part) for part in (recs[:third], recs[-third:]))
        growing = bool(first and last) and last[len(last) // 2] > 2 * first[len(first) // 2] + 0.05
        clean = o["errors"] == 0 and p99 <= args.slo_s and not growing
        rows.append({"rate": rate, "sent": o["sent"], "answered": o["answered"], "errors": o["errors"],
                     "e2e_p99_s": round(p99, 2), "queue_growing": growing, "clean": clean})
        print(f"  rate {rate:6.2f}/s: sent {o['sent']:4d} answered {o['answered']:4d} errors {o['errors']:3d} "
              f"p99 {p99:6.2f}s{' queue growing' if growing else ''} {'clean' if clean else 'NOT clean'}", flush=True)
        wait_idle(server, base + sum(x["sent"] for x in rows), 120)
        return clean

    base = int(mem.total(mem.try_scrape(server.endpoints.metrics_url) or {}, "trtspec_requests_total") or 0)
    rate, best, worst = args.start_rate, None, None
    while rate <= args.burst_rate:  # double while clean ...
        if not clean_at(rate):
            worst = rate
            break
        best, rate = rate, rate * 2
    if best is not None and worst is not None and clean_at((best + worst) / 2):  # ... then one step of bisection
        best = (best + worst) / 2
    return (best or args.start_rate), rows


def rss_mib(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


def plot(samples: list, bursts: list[tuple[float, float]], per_process: list, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, ax2) = plt.subplots(2, 1, figsize=(9, 7), sharex=True)
    for name, label in (("pss_bytes", "PSS, server + stubs (/proc)"), ("rss_bytes", "RSS, server + stubs (/proc)")):
        ts, vs = mem.series(samples, name)
        if vs:
            ax.plot(ts, [v / 2**20 for v in vs], label=label)
    for role in sorted({r for s in samples for r in s.model_bytes}):
        pts = [(s.t_s, s.model_bytes[role]) for s in samples if role in s.model_bytes]
        ax.plot([t for t, _ in pts], [v / 2**20 for _, v in pts], "--",
                label=f"trtspec_model_memory_bytes{{role={role}}} (Triton metrics)")
    if per_process:
        for n in per_process[0][1]:
            ax2.plot([t for t, _ in per_process], [v[n] for _, v in per_process], label=f"{n} RSS")
    for a in (ax, ax2):
        for b0, b1 in bursts:
            a.axvspan(b0, b1, color="orange", alpha=0.2)
        a.set_ylabel("MiB")
        a.legend(fontsize=8)
    ax.set_title("Memory during the soak (orange: bursts)")
    ax2.set_xlabel("seconds")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pair", choices=PAIRS, default="tiny")
    ap.add_argument("--rate", type=float, default=None, help="Soak rate (requests/s); default: find it.")
    ap.add_argument("--start-rate", type=float, default=1.0)
    ap.add_argument("--slo-s", type=float, default=10.0, help="p99 latency a clean rate must keep.")
    ap.add_argument("--headroom", type=float, default=0.8,
                    help="Soak at this share of the highest clean rate, so the queue drains after each burst.")
    ap.add_argument("--duration", type=float, default=600.0)
    ap.add_argument("--burst-rate", type=float, default=200.0)
    ap.add_argument("--burst-s", type=float, default=2.0)
    ap.add_argument("--burst-every", type=float, default=60.0)
    ap.add_argument("--max-tokens", default="16-48")
    ap.add_argument("--timeout-s", type=float, default=60.0, help="Client timeout per request (then cancelled).")
    ap.add_argument("--max-queue", type=int, default=64, help="spec_decode's max_queue: waiting requests before refusals.")
    ap.add_argument("--long-share", type=float, default=0.0, help="Share of requests with a long prompt.")
    ap.add_argument("--long-tokens", default="2000-4000", help="Their prompt length in tokens, LO-HI.")
    ap.add_argument("--long-max-tokens", type=int, default=16, help="max_tokens of a long request.")
    ap.add_argument("--prefill-chunk", type=int, default=None, help="spec_decode's prefill_chunk_tokens (0: off).")
    ap.add_argument("--out", type=Path, default=Path("results/soak"))
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="trtspec-soak-"))
    target, draft = pair_paths(args.pair, work)
    if args.long_share > 0:
        PROMPTS[:] = mixed_prompts(target, args.long_share, args.long_tokens, args.long_max_tokens)
    (work / "policy.yaml").write_text(POLICY)
    spec = {"max_queue": args.max_queue}
    if args.prefill_chunk is not None:
        spec["prefill_chunk_tokens"] = args.prefill_chunk
    repo = write_model_repo(work / "model_repo", target_checkpoint=target, draft_checkpoint=draft,
                            max_tokens_limit=256, policy_file=work / "policy.yaml", spec_decode_parameters=spec)
    checks: dict[str, bool] = {}
    with TritonServer(repo, log_file=args.out / "tritonserver.log") as server:
        print(f"server pid {server.pid}; {args.pair} pair; endpoints {server.endpoints.grpc}", flush=True)
        stubs_before = stubs.stub_pids(server.pid)
        rate_rows: list[dict] = []
        found = None
        if args.rate is None:
            print(f"finding the highest clean rate ({STEP_S:.0f} s per step):", flush=True)
            found, rate_rows = find_rate(server, args)
            args.rate = round(found * args.headroom, 2)
            print(f"highest clean rate {found:g} req/s; soaking at {args.headroom:g} x that", flush=True)
        base_count = int(mem.total(mem.try_scrape(server.endpoints.metrics_url) or {}, "trtspec_requests_total") or 0)
        print(f"soak: {args.rate:g} req/s for {args.duration:.0f}s, bursts of {args.burst_rate:g} req/s for "
              f"{args.burst_s:g}s every {args.burst_every:g}s", flush=True)
        bursts: list[tuple[float, float]] = []
        burst_results: list[BenchResult] = []
        t0 = time.monotonic()
        stop = threading.Event()

        def burster() -> None:
            i = 0
            while not stop.wait(args.burst_every if i else min(args.burst_every, 30.0)):
                start = time.monotonic() - t0
                if start + args.burst_s > args.duration:
                    return
                burst_results.append(bench(server.endpoints.grpc, args.burst_rate, args.burst_s, args.max_tokens,
                                           args.timeout_s, seed=1000 + i))
                bursts.append((start, start + args.burst_s))
                i += 1

        per_process: list[tuple[float, dict[str, float]]] = []  # (t, MiB of RSS by process)
        names = {server.pid: "tritonserver", **{ps[0]: m for m, ps in stubs_before.items()}}

        def sampler() -> None:
            while not stop.wait(2.0):
                per_process.append((time.monotonic() - t0, {n: rss_mib(pid) for pid, n in names.items()}))

        bt = threading.Thread(target=burster, daemon=True)
        bt.start()
        st = threading.Thread(target=sampler, daemon=True)
        st.start()
        steady = bench(server.endpoints.grpc, args.rate, args.duration, args.max_tokens, args.timeout_s, seed=7,
                       metrics_url=server.endpoints.metrics_url, pid=server.pid)
        stop.set()
        bt.join(args.timeout_s + 60)
        results = [steady, *burst_results]
        sent = sum(r.summary["overall"]["sent"] for r in results)
        answered = sum(r.summary["overall"]["answered"] for r in results)
        refused = sum(r.summary["overall"]["errors"] for r in results)
        categories: dict[str, int] = {}
        examples: dict[str, str] = {}
        for r in results:
            for rec in r.records:
                if rec.error is not None:
                    categories[rec.error_category or "other"] = categories.get(rec.error_category or "other", 0) + 1
                    examples.setdefault(rec.error_category or "other", rec.error)
        server_done = wait_idle(server, base_count + sent, 180) - base_count
        checks["sent == answered + refused (client)"] = sent == answered + refused
        checks["server ended every request sent"] = server_done == sent
        checks["every refusal is a clear one-line error"] = all(
            e and "\n" not in e and "internal error" not in e.lower() for e in examples.values())
        checks["no request timed out (refusals come at once)"] = "timeout" not in categories
        stubs_after = stubs.stub_pids(server.pid)
        checks["no stub died (same PIDs, alive)"] = stubs_after == stubs_before and all(
            stubs.alive(p) for ps in stubs_after.values() for p in ps)
        deadline = time.monotonic() + 60
        sessions = {}
        while time.monotonic() < deadline:
            sessions = {m: (statusfile.read_status(server.status_dir / f"{m}.json") or {}).get("sessions")
                        for m in ("draft", "target")}
            if all(v == 0 for v in sessions.values()):
                break
            time.sleep(0.5)
        checks["KV-cache sessions all freed"] = all(v == 0 for v in sessions.values())
        control = statusfile.read_status(server.status_dir / "spec_decode.json") or {}
        reloads = {m: {k: (control.get(m) or {}).get(k) for k in ("reloads", "probe_failures", "outages")}
                   for m in ("draft", "target")}
        checks["no model reloaded or failed a probe (busy is not dead)"] = all(
            v["reloads"] == 0 and v["probe_failures"] == 0 for v in reloads.values())
        ttft = ttft_during_prefills([rec for r in results for rec in r.records])
        samples = steady.memory
        # Warm-up: the first 20% of the run, and at least until the first burst is over (a burst
        # raises the high-water mark of KV caches once: the allocator keeps what it got).
        warm_until = max(0.2 * args.duration, (bursts[0][1] + 5.0) if bursts else 0.0)
        warm = [s for s in samples if s.t_s >= warm_until]
        ts, vs = mem.series(warm, "pss_bytes")
        if not vs:
            ts, vs = mem.series(warm, "rss_bytes")
        slope_mb_min = mem._slope(ts, vs) * 60 / 2**20 if len(vs) > 1 else 0.0
        growth_mb = (vs[-1] - vs[0]) / 2**20 if vs else 0.0
        level_mb = (sum(vs) / len(vs)) / 2**20 if vs else 0.0
        growth_by_process = {}
        late = [(t, v) for t, v in per_process if t >= warm_until]
        if late:
            for n in late[0][1]:
                growth_by_process[n] = round(late[-1][1][n] - late[0][1][n], 2)
        checks["memory flat after warm-up: every stub (|RSS growth| <= 8 MiB)"] = bool(growth_by_process) and all(
            abs(v) <= 8.0 for n, v in growth_by_process.items() if n != "tritonserver")
        server_growth_b_per_req = (growth_by_process.get("tritonserver", 0.0) * 2**20 / max(1, sent))
        plot(samples, bursts, per_process, args.out / "memory.png")
        o = steady.summary["overall"]
        burst_sent = sum(r.summary["overall"]["sent"] for r in burst_results)
        burst_ans = sum(r.summary["overall"]["answered"] for r in burst_results)
        report = {
            "pair": args.pair, "rate": args.rate, "highest_clean_rate": found, "duration_s": args.duration,
            "rate_search": rate_rows,
            "sent": sent, "answered": answered, "refused": refused, "refused_by_category": categories,
            "refusal_examples": examples, "server_ended": server_done,
            "steady": {"sent": o["sent"], "answered": o["answered"], "errors": o["errors"],
                       "e2e_ms": o["e2e_ms"], "ttft_ms": o["ttft_ms"], "acceptance_rate": o["acceptance_rate"],
                       "speculated_share": o["speculated_share"]},
            "bursts": {"count": len(burst_results), "sent": burst_sent, "answered": burst_ans,
                       "refused": burst_sent - burst_ans},
            "memory": {"samples": len(samples), "warm_up_s": round(warm_until, 1),
                       "rss_growth_after_warmup_mib_by_process": growth_by_process,
                       "tritonserver_growth_bytes_per_request": round(server_growth_b_per_req),
                       "pss_or_rss_level_mb": round(level_mb, 1),
                       "growth_after_warmup_mb": round(growth_mb, 2), "slope_mb_per_min": round(slope_mb_min, 3),
                       "summary": steady.memory_summary},
            "sessions_after": sessions, "stubs": {"before": stubs_before, "after": stubs_after},
            "long_prompts": {"share": args.long_share, "tokens": args.long_tokens,
                             "prefill_chunk_tokens": args.prefill_chunk, "ttft": ttft},
            "supervisors": reloads,
            "checks": checks,
        }
    (args.out / "soak.json").write_text(json.dumps(report, indent=2, default=str))
    print("\n== soak figures ==")
    print(f"pair {args.pair}; rate {args.rate:g} req/s for {args.duration:.0f}s; {len(burst_results)} bursts of "
          f"{args.burst_rate:g} req/s x {args.burst_s:g}s")
    print(f"sent {sent} = answered {answered} + refused {refused}; server ended {server_done}")
    print(f"refused by category: {categories or '-'}")
    for c, e in examples.items():
        print(f"  e.g. {c}: {e}")
    print(f"steady: answered {o['answered']}/{o['sent']}, e2e p50 {o['e2e_ms'].get('p50') or 0:.0f} ms, "
          f"p99 {o['e2e_ms'].get('p99') or 0:.0f} ms, acceptance {o['acceptance_rate']}")
    print(f"bursts: answered {burst_ans}/{burst_sent}, refused {burst_sent - burst_ans}")
    print(f"memory after warm-up ({warm_until:.0f}s): level {level_mb:.0f} MiB, growth {growth_mb:+.1f} MiB, "
          f"slope {slope_mb_min:+.2f} MiB/min ({len(samples)} samples) -> {args.out / 'memory.png'}")
    print(f"RSS growth after warm-up by process (MiB): {growth_by_process} "
          f"(tritonserver: {server_growth_b_per_req:.0f} B per request sent)")
    print(f"sessions after: {sessions}; stubs {stubs_before} -> {stubs_after}")
    print(f"supervisors: {reloads}")
    if args.long_share > 0:
        print(f"long prompts: {args.long_share:.0%} at {args.long_tokens} tokens, prefill_chunk_tokens "
              f"{'default' if args.prefill_chunk is None else args.prefill_chunk}")
        print(f"TTFT of short requests sent during a long prefill: {ttft['short_during_long_prefill_ms']}")
        print(f"TTFT of the other short requests: {ttft['short_otherwise_ms']}; long requests: {ttft['long_ttft_ms']}")
    for name, ok in checks.items():
        print(f"[{'ok' if ok else 'FAIL'}] {name}")
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
