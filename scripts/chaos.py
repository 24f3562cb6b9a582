#!/usr/bin/env python
"""Chaos during load: kill the draft's stub, inject wrong drafts and random draft delays;
the service must keep answering, exactly as the target alone would.

    python scripts/chaos.py                                  # tiny pair, 10 min, 5+ kills
    python scripts/chaos.py --pair demo --duration 300 --kills 5 --rate 0.5
    python scripts/chaos.py --duration 180 --kills 5 --out results/chaos
    python scripts/chaos.py --pair tiny-long --long-share 0.1 --duration 120 --kills 3

Starts its own tritonserver on the chosen pair with the draft's fault
injection on (``fault_wrong_share``: a share of drafted tokens replaced by
wrong ones, 50% by default; ``fault_delay_s`` / ``fault_delay_share``: random
draft delays), then for ``--duration`` seconds:

- sends greedy requests (open loop, Poisson at ``--rate``) over gRPC, from a
  fixed set of prompts, and checks every answer token for token against the
  in-process target alone (the reference is computed first, outside the server);
- kills the draft's stub (``kill -9``) at a random moment of each of
  ``--kills`` equal slices of the run (never in the last 20 s), and measures
  from the kill to "speculation resumed": spec_decode's supervisor reports the
  draft healthy again after a reload (its status file, written every second,
  so up to a second late), which is when new requests speculate again;
  confirmed by a request sent after the kill that drafted tokens. ``--kill-at
  asleep`` kills it only while it sleeps in an injected delay: a kill at any
  moment can land while the stub holds a lock it shares with the server, and
  Triton 2.51 then aborts as a whole (docs/reliability.md, "A stub killed
  mid-call"), which the run names when it happens.

Prints: requests sent / answered / errors (by message), greedy identity
(checked, identical, different), fallbacks and route decisions from the
server's counters, kills and each kill's time to resume, and writes
``chaos.json`` into ``--out``. The breaker is off in this run (static k): the
wrong-draft share alone would keep it open and hide the recovery being
measured; the breaker's reaction to bad and late drafts is tested in
tests/reliability. Exit code 0 when every answer was identical, nothing was
lost, and every kill was followed by resumed speculation within the goal.

``--long-share``: that share of the requests (every n-th) carries a long
prompt (``--long-tokens``; ``tiny-long`` or ``demo`` pair), checked like the
others; the run then also requires that the target was never reloaded (only
the draft is killed: a target busy with a long prefill is not a dead one).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from trtspec.bench import memory as mem  # noqa: E402
from trtspec.builder.repo import write_model_repo  # noqa: E402
from trtspec.serving import statusfile, stubs  # noqa: E402
from trtspec.serving.client import ClientError, GenerateParams, generate_grpc  # noqa: E402
from trtspec.serving.launcher import TritonServer  # noqa: E402
from trtspec.decoding import FixedDraftLength, GenerationRequest, StopCriteria  # noqa: E402
from trtspec.errors import ContextOverflowError  # noqa: E402
from trtspec.bench.workload import long_prompt_texts  # noqa: E402
from trtspec.testing.tiny import PAIRS, pair_paths  # noqa: E402

POLICY = """
draft_length:
  controller: static
  static: {k: 4}
breaker: {enabled: false}
fallback: {enabled: false}
"""

PROMPTS = (
    "What is speculative decoding?",
    "Write a haiku about the sea.",
    "List three prime numbers.",
    "Explain what a GPU does in one sentence.",
    "Say hello in French.",
    "Why is the sky blue?",
    "Give me a name for a cat.",
    "What is 12 times 12?",
)
RESUME_GOAL_S = 30.0


def references(target: Path, max_tokens: int, prompts: list[str]) -> dict[str, list[int]]:
    """The target alone, in this process, tokenized as spec_decode does (chat template on)."""
    from trtspec.runtime.pair import load_pair

    pair = load_pair(target, None)
    tok = pair.target.tokenizer
    out = {}
    for p in prompts:
        req = GenerationRequest(prompt_ids=tuple(tok.encode_prompt(p)),
                                stop=StopCriteria(max_new_tokens=max_tokens, eos_token_ids=tok.eos_token_ids()))
        out[p] = pair.decoder().generate(req, FixedDraftLength(0)).token_ids
    return out


def counters(server: TritonServer) -> dict:
    m = mem.try_scrape(server.endpoints.metrics_url) or {}
    out: dict = {}
    for name in ("trtspec_fallbacks_total", "trtspec_route_decisions_total", "trtspec_requests_total"):
        for labels, v in m.get(name, {}).items():
            d = dict(labels)
            key = d.get("reason") or d.get("outcome") or ""
            if name == "trtspec_route_decisions_total":
                key = f"{d.get('route')}:{key}"
            out.setdefault(name, {})[key] = out.get(name, {}).get(key, 0.0) + v
    return out


def delta(after: dict, before: dict) -> dict:
    return {n: {k: v - before.get(n, {}).get(k, 0.0) for k, v in d.items() if v - before.get(n, {}).get(k, 0.0)}
            for n, d in after.items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pair", choices=PAIRS, default="tiny")
    ap.add_argument("--duration", type=float, default=600.0)
    ap.add_argument("--rate", type=float, default=4.0, help="Requests/s (open loop, Poisson).")
    ap.add_argument("--kills", type=int, default=5)
    ap.add_argument("--kill-at", choices=("anytime", "asleep"), default="anytime",
                    help="anytime: a random moment; asleep: while the stub sleeps in an injected delay")
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--wrong-share", type=float, default=0.5)
    ap.add_argument("--delay-s", type=float, default=0.05, help="Draft delay per delayed forward pass.")
    ap.add_argument("--delay-share", type=float, default=0.1, help="Share of draft forward passes delayed.")
    ap.add_argument("--timeout-s", type=float, default=120.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--long-share", type=float, default=0.0, help="Share of requests with a long prompt.")
    ap.add_argument("--long-tokens", default="2000-3800", help="Their prompt lengths in tokens, LO-HI (3 lengths).")
    ap.add_argument("--out", type=Path, default=Path("results/chaos"))
    args = ap.parse_args()
    if args.kill_at == "asleep" and not (args.delay_s > 0 and args.delay_share > 0):
        ap.error("--kill-at asleep needs draft delays to kill the stub in (--delay-s and --delay-share > 0)")
    kill = stubs.kill_stub_asleep if args.kill_at == "asleep" else stubs.kill_stub
    args.out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(args.seed)
    work = Path(tempfile.mkdtemp(prefix="trtspec-chaos-"))
    target, draft = pair_paths(args.pair, work)
    long_prompts: list[str] = []
    every = 0
    if args.long_share > 0:
        from trtspec.runtime.tokenizer import Tokenizer

        lo, _, hi = args.long_tokens.partition("-")
        lo_n, hi_n = int(lo), int(hi or lo)
        long_prompts = long_prompt_texts(Tokenizer.from_dir(target), [lo_n, (lo_n + hi_n) // 2, hi_n])
        every = max(1, round(1 / args.long_share))
    print("computing the target-alone references in-process ...", flush=True)
    try:
        refs = references(target, args.max_tokens, [*PROMPTS, *long_prompts])
    except ContextOverflowError as e:
        ap.error(f"--long-tokens {args.long_tokens}: {e} (the {args.pair} pair; tiny-long holds 4,096)")
    (work / "policy.yaml").write_text(POLICY)
    repo = write_model_repo(
        work / "model_repo", target_checkpoint=target, draft_checkpoint=draft, max_tokens_limit=256,
        policy_file=work / "policy.yaml",
        draft_parameters={"fault_wrong_share": args.wrong_share, "fault_delay_s": args.delay_s,
                          "fault_delay_share": args.delay_share, "fault_seed": args.seed},
    )
    lock = threading.Lock()
    records: list[dict] = []
    kills: list[dict] = []
    with TritonServer(repo, log_file=args.out / "tritonserver.log") as server:
        print(f"server pid {server.pid}; {args.pair} pair; {args.rate:g} req/s for {args.duration:.0f}s; "
              f"{args.kills} kills; wrong drafts {args.wrong_share:.0%}; delays {args.delay_s}s x {args.delay_share:.0%}",
              flush=True)
        before = counters(server)
        t0 = time.monotonic()
        end = t0 + args.duration

        def control() -> dict:
            return statusfile.read_status(server.status_dir / "spec_decode.json") or {}

        def one(i: int) -> None:
            long = every and i % every == every - 1
            prompt = long_prompts[(i // every) % len(long_prompts)] if long else PROMPTS[i % len(PROMPTS)]
            sent = time.monotonic() - t0
            rec: dict = {"i": i, "prompt": i % len(PROMPTS), "long": bool(long), "sent_s": round(sent, 2)}
            try:
                r = generate_grpc(server.endpoints.grpc, prompt, GenerateParams(max_tokens=args.max_tokens),
                                  timeout_s=args.timeout_s)
                rec.update(ok=True, identical=r.output_ids == refs[prompt], drafted=r.num_draft_tokens,
                           accepted=r.num_accepted_tokens)
            except ClientError as e:
                rec.update(ok=False, error=e.message)
            rec["done_s"] = round(time.monotonic() - t0, 2)
            with lock:
                records.append(rec)

        def load() -> None:
            with ThreadPoolExecutor(64) as pool:
                i, at = 0, 0.0
                while True:
                    at += rng.expovariate(args.rate)
                    if t0 + at >= end:
                        break
                    time.sleep(max(0.0, t0 + at - time.monotonic()))
                    pool.submit(one, i)
                    i += 1

        def chaos() -> None:
            usable = args.duration - 20.0
            for k in range(args.kills):
                lo, hi = usable * k / args.kills, usable * (k + 1) / args.kills
                at = t0 + rng.uniform(lo + 0.3 * (hi - lo), hi)
                # never kill a draft that is still coming back from the previous kill
                while time.monotonic() < at or control().get("draft", {}).get("state") != "healthy":
                    if time.monotonic() > end - 10:
                        return
                    time.sleep(0.1)
                reloads = control().get("draft", {}).get("reloads", 0)
                try:
                    pid = kill(server.pid, "draft")
                except (LookupError, TimeoutError) as e:
                    print(f"  kill {k + 1}: {e}", flush=True)
                    continue
                killed = time.monotonic()
                entry = {"kill": k + 1, "at_s": round(killed - t0, 1), "pid": pid, "resumed_after_s": None,
                         "first_drafting_request": None}
                kills.append(entry)
                while time.monotonic() < min(end, killed + 120):
                    c = control().get("draft", {})
                    if c.get("reloads", 0) > reloads and c.get("state") == "healthy":
                        # the supervisor says healthy (status file, written every second): new requests speculate
                        entry["resumed_after_s"] = round(time.monotonic() - killed, 2)
                        break
                    time.sleep(0.1)
                print(f"  kill {k + 1} at {entry['at_s']:.0f}s (pid {pid}): speculation resumed after "
                      f"{entry['resumed_after_s']}s", flush=True)

        threads = [threading.Thread(target=load), threading.Thread(target=chaos)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        after = counters(server)
        stubs_now = stubs.stub_pids(server.pid)
        final = control()
        aborted = None if server.alive() else (server.known_abort() or "tritonserver exited; see its log")
    answered = [r for r in records if r["ok"]]
    errors = Counter(r["error"] for r in records if not r["ok"])
    identical = sum(1 for r in answered if r["identical"])
    drafted = sum(r["drafted"] for r in answered)
    accepted = sum(r["accepted"] for r in answered)
    d = delta(after, before)
    for k in kills:  # confirmed from the client side: the first request sent after the kill that drafted
        drafting = [r for r in answered if r["sent_s"] > k["at_s"] and r["drafted"] > 0]
        first = min(drafting, key=lambda r: r["sent_s"]) if drafting else None
        k["first_drafting_request"] = (
            {"sent_after_s": round(first["sent_s"] - k["at_s"], 2), "done_after_s": round(first["done_s"] - k["at_s"], 2)}
            if first else None)
    resume = [k["resumed_after_s"] for k in kills if k["resumed_after_s"] is not None and k["first_drafting_request"]]
    report = {
        "pair": args.pair, "duration_s": args.duration, "rate": args.rate,
        "faults": {"wrong_share": args.wrong_share, "delay_s": args.delay_s, "delay_share": args.delay_share},
        "sent": len(records), "answered": len(answered), "errors": dict(errors),
        "greedy_identity": {"checked": len(answered), "identical": identical, "different": len(answered) - identical},
        "drafted": drafted, "accepted": accepted,
        "acceptance_rate": accepted / drafted if drafted else None,
        "server_counters_delta": d, "kills": kills,
        "resume_s": {"max": max(resume) if resume else None, "mean": sum(resume) / len(resume) if resume else None},
        "draft_supervisor_final": final.get("draft"), "target_supervisor_final": final.get("target"),
        "stubs_final": stubs_now, "kill_at": args.kill_at, "server_aborted": aborted,
        "long_prompts": {"share": args.long_share, "sent": sum(1 for r in records if r["long"]),
                         "answered": sum(1 for r in answered if r["long"])},
    }
    (args.out / "chaos.json").write_text(json.dumps(report, indent=2, default=str))
    print("\n== chaos figures ==")
    print(f"pair {args.pair}; {args.duration:.0f}s at {args.rate:g} req/s; wrong drafts {args.wrong_share:.0%}, "
          f"delays {args.delay_s}s on {args.delay_share:.0%} of draft passes; {len(kills)} kills of the draft stub")
    print(f"requests: sent {len(records)}, answered {len(answered)}, errors {sum(errors.values())} {dict(errors) or ''}")
    print(f"greedy identity vs the target alone: {identical}/{len(answered)} identical")
    rate = f"{accepted / drafted:.1%}" if drafted else "n/a"
    print(f"drafted {drafted}, accepted {accepted} ({rate})")
    print(f"fallbacks (server): {d.get('trtspec_fallbacks_total', {})}")
    print(f"route decisions (server): {d.get('trtspec_route_decisions_total', {})}")
    print(f"request outcomes (server): {d.get('trtspec_requests_total', {})}")
    for k in kills:
        f = k["first_drafting_request"]
        seen = (f"first request that drafted again: sent +{f['sent_after_s']}s, done +{f['done_after_s']}s"
                if f else "no request drafted again")
        print(f"kill {k['kill']} at {k['at_s']:.0f}s: speculation resumed after {k['resumed_after_s']}s; {seen}")
    if resume:
        print(f"kill -> speculation resumed: max {max(resume):.1f}s, mean {sum(resume) / len(resume):.1f}s "
              f"(goal < {RESUME_GOAL_S:.0f}s)")
    target_final = final.get("target") or {}
    print(f"long prompts: {report['long_prompts']}; target supervisor: reloads {target_final.get('reloads')}, "
          f"probe failures {target_final.get('probe_failures')}, state {target_final.get('state')}")
    if aborted:
        print(f"tritonserver aborted during the run: {aborted}")
    ok = (aborted is None and len(answered) == len(records) and identical == len(answered) and len(kills) >= args.kills
          and len(resume) == len(kills) and all(x < RESUME_GOAL_S for x in resume)
          and target_final.get("reloads") == 0)
    print("[ok]" if ok else "[FAIL]", "the server up, every request answered, identical, every kill recovered "
          "within the goal, the target never reloaded")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
