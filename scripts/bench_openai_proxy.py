"""What the OpenAI-compatible endpoint costs: tokens/s and TTFT through it vs Triton gRPC directly.

The demo pair served as a user serves it: ``trtspec serve --openai-port`` in a
process of its own (tritonserver, and the endpoint on a thread of ``trtspec serve``),
apart from this process, the load generator. At each concurrency the two paths alternate for ``--rounds``
rounds (a machine that speeds up or slows down weighs on both alike), each run
``trtspec bench``'s closed loop (``run_bench``) with ``--speculation`` (default ``auto``;
``off`` sends one token per response, the most work per token for the proxy),
greedy: gRPC sends the prompt for ``spec_decode`` to template, the OpenAI path
sends it as one chat message that the proxy templates, so both decode the same
tokens. Reported: medians over rounds of tokens/s and of the TTFT p50, and the
proxy's cost (goal: <= 3% tokens/s, <= 10 ms TTFT): tokens/s from those medians,
TTFT from the p50 and mean of every round's requests after its first
``concurrency`` pooled (the opening burst queues its prefills one behind another
on both paths; at concurrency 4 a request's TTFT is bimodal, its prefill at once
or behind another request's pass, and a p50 of few requests falls on either mode).

Where the time to first token goes: around each run both metrics endpoints are
scraped, Triton's (``trtspec_time_to_first_token_seconds``: ``spec_decode``
received the request -> its first token) and the endpoint's own
(``trtspec_openai_time_to_first_token_seconds``: the endpoint received the HTTP
request -> the first text sent), and the mean TTFT of the run is split by layer:
``spec_decode``; the endpoint (its TTFT less spec_decode's: templating, the gRPC
hop, its event loop); the client and its transport (the client's TTFT less the
layer below: the SDK and HTTP, or tritonclient and gRPC). The proxy's own cost is
the TTFT above ``spec_decode`` on the OpenAI path less that on the gRPC path, per
round: the two runs' ``spec_decode`` TTFTs (queueing, prefill: the model's noise,
and on few cores the CPU the endpoint takes from the models) do not enter it.

    nice python scripts/bench_openai_proxy.py [--requests 32] [--max-tokens 64] [--concurrency 1,4] [--rounds 3]
    python scripts/bench_openai_proxy.py --pair tiny --requests 64 --rounds 5   # the proxy's own cost

``--pair tiny`` (random tiny models: a forward costs milliseconds, not the demo
pair's ~100 ms on a slow CPU) leaves little but the two paths' own cost to
measure, where the demo pair's round-to-round spread is larger than the goal.
On a machine with few cores the CPU the endpoint and the SDK spend per streamed
token (docs/serving.md, "What the endpoint costs") is taken from the model's.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

from trtspec.bench import ArmSplit, BenchConfig, OutputLength, builtin_prompts, run_bench
from trtspec.bench.memory import scrape, total
from trtspec.builder.repo import write_model_repo
from trtspec.testing.serve import serve_process
from trtspec.testing.tiny import PAIRS, pair_paths, with_chat_template


def run(url: str, protocol: str, concurrency: int, requests: int, max_tokens: int, arm: str = "auto") -> dict:
    cfg = BenchConfig(url=url, protocol=protocol, prompts=builtin_prompts(), workload_split=ArmSplit.parse(arm),
                      output=OutputLength.parse(str(max_tokens)), concurrency=concurrency, requests=requests,
                      timeout_s=600, probe=False)
    result = run_bench(cfg)
    a = result.summary["by_arm"][arm]
    if a["errors"]:
        raise SystemExit(f"{protocol}: {a['errors']} request(s) failed: {a['errors_by_category']}")
    return {"tokens_per_s": a["tokens_per_s"], "ttft_p50_ms": a["ttft_ms"]["p50"],
            "ttft_mean_ms": a["ttft_ms"]["mean"], "tokens": a["output_tokens"],
            "acceptance_rate": a["acceptance_rate"], "client_cpu_s": result.client["cpu_s"],
            "ttft_ms_each": [round(1e3 * r.ttft_s, 2) for r in result.records]}


def cpu_s(pid: int) -> float:
    """CPU seconds (user + system) ``pid`` has spent, its children not counted (Linux ``/proc``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


TTFT_METRIC = {"spec_decode": "trtspec_time_to_first_token_seconds",
               "endpoint": "trtspec_openai_time_to_first_token_seconds"}


def ttft_totals(metrics_urls: dict[str, str]) -> dict[str, tuple[float, float]]:
    """``(sum, count)`` of each layer's TTFT histogram (:data:`TTFT_METRIC`), all series summed."""
    out = {}
    for layer, url in metrics_urls.items():
        m = scrape(url)
        out[layer] = (total(m, TTFT_METRIC[layer] + "_sum") or 0.0, total(m, TTFT_METRIC[layer] + "_count") or 0.0)
    return out


def mean_ms(before: tuple[float, float], after: tuple[float, float]) -> float | None:
    n = after[1] - before[1]
    return round(1e3 * (after[0] - before[0]) / n, 2) if n > 0 else None


def measured(pid: int, metrics_urls: dict[str, str], url: str, protocol: str, *args) -> dict:
    """:func:`run`; the CPU per output token of the client (``run_bench``'s own figure) and of
    ``pid`` (``trtspec serve``: the endpoint; the models run in tritonserver, its child); the mean
    TTFT of each layer the requests went through (``metrics_urls``: layer -> its /metrics)."""
    layers = {k: v for k, v in metrics_urls.items() if protocol == "openai" or k != "endpoint"}
    serve0, ttft0 = cpu_s(pid), ttft_totals(layers)
    row = run(url, protocol, *args)
    ttft1 = ttft_totals(layers)
    per_token = 1e3 / row["tokens"]
    return {**row, "client_cpu_ms_per_token": round(row.pop("client_cpu_s") * per_token, 3),
            "serve_cpu_ms_per_token": round((cpu_s(pid) - serve0) * per_token, 3),
            **{f"{layer}_ttft_mean_ms": mean_ms(ttft0[layer], ttft1[layer]) for layer in layers}}


def ttft_shares(row: dict) -> dict[str, float]:
    """A run's mean client TTFT split by layer (ms): spec_decode, the endpoint (OpenAI path), the client."""
    spec, client = row["spec_decode_ttft_mean_ms"], row["ttft_mean_ms"]
    below_client = row.get("endpoint_ttft_mean_ms") or spec
    shares = {"spec_decode": spec, "client": client - below_client}
    if row["protocol"] == "openai":
        shares["endpoint"] = below_client - spec
    return {k: round(v, 2) for k, v in shares.items()}


def ttft_split(rows: list[dict]) -> dict:
    """One concurrency's runs: the medians over rounds of each path's TTFT shares, and the proxy's
    own TTFT (the TTFT above spec_decode on the OpenAI path less on the gRPC path, round by round)."""
    shares = {}
    for protocol in ("grpc", "openai"):
        mine = [r["ttft_share_ms"] for r in rows if r["protocol"] == protocol]
        shares[protocol] = {k: round(statistics.median(s[k] for s in mine), 2) for k in mine[0]}
    above = {(r["round"], r["protocol"]): r["ttft_mean_ms"] - r["spec_decode_ttft_mean_ms"] for r in rows}
    own = [above[(rnd, "openai")] - above[(rnd, "grpc")] for rnd in sorted({r["round"] for r in rows})]
    return {"ttft_share_ms": shares, "ttft_proxy_own_ms": round(statistics.median(own), 2),
            "ttft_proxy_own_ms_rounds": [round(x, 2) for x in own]}


def steady_ttft(rows: list[dict], c: int) -> dict:
    """The client TTFTs of every round's requests after its first ``c`` (the closed loop's opening burst:
    ``c`` prefills at once, queued one behind another on both paths), pooled: p50, mean, count."""
    xs = [x for r in rows for x in r["ttft_ms_each"][c:]]
    return {"p50_ms": statistics.median(xs), "mean_ms": statistics.mean(xs), "n": len(xs)}


def report(rows: list[dict]) -> list[dict]:
    """Print the table and the proxy's cost per concurrency; return the summary."""
    print(f"{'conc':>4} {'path':<7}{'tok/s (rounds)':<28}{'TTFT p50 ms (rounds)':<28}")
    summary = []
    for c in sorted({r["concurrency"] for r in rows}):
        med, steady = {}, {}
        for protocol in ("grpc", "openai"):
            mine = [r for r in rows if r["concurrency"] == c and r["protocol"] == protocol]
            tps, ttft = [r["tokens_per_s"] for r in mine], [r["ttft_p50_ms"] for r in mine]
            med[protocol], steady[protocol] = (statistics.median(tps), statistics.median(ttft)), steady_ttft(mine, c)
            cpu = [statistics.median(r[k] for r in mine) for k in ("client_cpu_ms_per_token", "serve_cpu_ms_per_token")]
            print(f"{c:>4} {protocol:<7}{med[protocol][0]:>6.1f} ({', '.join(f'{x:.1f}' for x in tps)})"
                  f"{'':<4}{med[protocol][1]:>6.0f} ({', '.join(f'{x:.0f}' for x in ttft)})"
                  f"{'':<4}CPU ms/token: client {cpu[0]:.2f}, trtspec serve {cpu[1]:.2f}")
        cost = 1 - med["openai"][0] / med["grpc"][0]
        extra = {k: steady["openai"][k] - steady["grpc"][k] for k in ("p50_ms", "mean_ms")}
        split = ttft_split([r for r in rows if r["concurrency"] == c])
        summary.append({"concurrency": c, "tokens_per_s_cost": cost, "ttft_p50_extra_ms": extra["p50_ms"],
                        "ttft_mean_extra_ms": extra["mean_ms"], "ttft_steady": steady, **split})
        print(f"     proxy cost at concurrency {c}: tokens/s {cost:+.1%} (goal <= 3%), TTFT p50 {extra['p50_ms']:+.1f} ms, "
              f"mean {extra['mean_ms']:+.1f} ms (goal <= 10 ms; the {steady['grpc']['n']} requests of each path "
              f"after each run's first {c}, pooled over rounds)")
        shares = "; ".join(f"{p}: " + ", ".join(f"{k} {v:.1f}" for k, v in split["ttft_share_ms"][p].items())
                           for p in ("grpc", "openai"))
        print(f"     mean TTFT by layer, ms (medians over rounds): {shares}")
        print(f"     TTFT above spec_decode, OpenAI less gRPC (the proxy's own): "
              f"{split['ttft_proxy_own_ms']:+.1f} ms (rounds {', '.join(f'{x:+.1f}' for x in split['ttft_proxy_own_ms_rounds'])})")
    return summary


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=32, help="requests per run (at least 2 x concurrency)")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--concurrency", default="1,4")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--work", type=Path, default=Path("results/openai_proxy"))
    ap.add_argument("--json-out", type=Path, default=None)
    ap.add_argument("--pair", choices=PAIRS, default="demo", help="the models (tiny: the proxy's own cost)")
    ap.add_argument("--speculation", choices=("auto", "on", "off"), default="auto",
                    help="the requests' speculation (on/off: the same work on both paths; auto: what the "
                         "controller learns differs from run to run)")
    args = ap.parse_args()
    say = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731

    target, draft = pair_paths(args.pair, args.work / "models")
    # the tiny tokenizer has no chat template; the OpenAI chat path needs one
    tokenizer = with_chat_template(target, args.work / "tokenizer") if args.pair != "demo" else None
    repo = write_model_repo(args.work / "model_repo", target_checkpoint=target, draft_checkpoint=draft,
                            tokenizer_dir=tokenizer, max_sessions=32, max_concurrency=8)
    rows: list[dict] = []
    with serve_process(repo, args.work / "tritonserver.log") as (proc, info):
        urls = {"grpc": info["endpoints"]["grpc"], "openai": info["endpoints"]["openai"]}
        metrics_urls = {"spec_decode": info["endpoints"]["metrics"],
                        "endpoint": urls["openai"].removesuffix("/v1") + "/metrics"}
        say("warm-up")
        for protocol, url in urls.items():
            run(url, protocol, 1, 2, 8, args.speculation)
        for c in [int(x) for x in args.concurrency.split(",") if x.strip()]:
            n = max(args.requests, 2 * c)
            for rnd in range(1, args.rounds + 1):
                for protocol, url in urls.items():
                    say(f"concurrency {c}, round {rnd}: {protocol}, {n} requests x {args.max_tokens} tokens")
                    row = {"concurrency": c, "round": rnd, "protocol": protocol,
                           **measured(proc.pid, metrics_urls, url, protocol, c, n, args.max_tokens, args.speculation)}
                    rows.append({**row, "ttft_share_ms": ttft_shares(row)})
                    print(json.dumps(rows[-1]), flush=True)  # each run as it ends: a cut-short run keeps its rows

    summary = report(rows)
    if args.json_out:
        args.json_out.parent.mkdir(parents=True, exist_ok=True)
        args.json_out.write_text(json.dumps({"rows": rows, "summary": summary, "args": vars(args)}, indent=2,
                                            default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
