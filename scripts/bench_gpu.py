#!/usr/bin/env python
"""GPU-grade runtime benchmark: step times by shape, eager vs graphs, and exact mode on the real pair.

    python scripts/bench_gpu.py                                   # both parts, CUDA if present
    python scripts/bench_gpu.py --part shapes --shapes 135m --layers 2 --reps 3   # shortened (CPU check)
    python scripts/bench_gpu.py --part pair --prompts 2 --max-tokens 8            # shortened (CPU check)

Part ``shapes`` (random weights, bf16): for SmolLM2-135M, Llama-1B and
Llama-8B shapes, the time of one pass of n = 1..9 new tokens at a fixed
context, eager (unpadded) vs graphs (rows padded to buckets, compiled layers in
a CUDA graph; on CPU: compiled layers, no graph) vs exact mode (every pass
``EXACT_ROWS`` rows, graphed on CUDA); with ``--pieces`` also graphs over layers
compiled as two pieces with the KV write between them (the layout before each
layer became one compiled piece); the bandwidth floor (weight and KV bytes
over the measured copy bandwidth); the draft cost ``c`` of the 135M shape
against the 1B and 8B shapes; Leviathan's predicted speedup at acceptance
0.6-0.9 from those figures. Part ``pair`` (the demo pair, target in bf16, INT8
draft): target alone vs speculative (k fixed), tokens/s, how many outputs are
identical, with exact mode on and off. Every output runs to ``--max-tokens``
(EOS does not stop it), so both modes time the same number of tokens.

Figures go to stdout (and ``--json-out``); progress to stderr.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

from trtspec.bench.inprocess import cpu_name, write_json
from trtspec.runtime.torch.lean import LeanLlamaLM
from trtspec.runtime.torch.llama import LayerOps, LlamaConfig, LlamaWeights
from trtspec.runtime.torch.shapes import EXACT_ROWS, GRAPH_ROWS, ShapePlan

# name: (hidden, intermediate, layers, heads, kv heads, head dim, vocab, tied embeddings)
SHAPES = {
    "135m": (576, 1536, 30, 9, 3, 64, 49152, True),  # SmolLM2-135M
    "1b": (2048, 8192, 16, 32, 8, 64, 128256, True),  # Llama-3.2-1B
    "8b": (4096, 14336, 32, 32, 8, 128, 128256, False),  # Llama-3.1-8B
}
ALPHAS = (0.6, 0.7, 0.8, 0.9)


def say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def synchronize(device: str) -> Callable[[], None]:
    return torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)


def median_s(fn: Callable[[], None], reps: int) -> float:
    fn()  # warm-up (and the capture of a new shape)
    return statistics.median(_elapsed_s(fn) for _ in range(reps))


def _elapsed_s(fn: Callable[[], None]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def copy_bandwidth(device: str) -> float:
    """Bytes per second a device-to-device copy moves (read + written)."""
    n = (1 << 30) if device.startswith("cuda") else (1 << 27)
    src = torch.empty(n, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    sync = synchronize(device)

    def copy() -> None:
        dst.copy_(src)
        sync()

    return 2 * n / median_s(copy, 5)


def random_weights(name: str, layers: int | None, context: int, dtype: torch.dtype, device: str,
                   pack: bool = True) -> LlamaWeights:
    hidden, inter, n_layers, heads, kv, hd, vocab, tied = SHAPES[name]
    cfg = LlamaConfig(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=inter, num_layers=layers or n_layers,
        num_heads=heads, num_kv_heads=kv, head_dim=hd, rms_norm_eps=1e-5, rope_theta=500000.0,
        max_position_embeddings=context, tie_word_embeddings=tied,
    )
    gen = torch.Generator(device).manual_seed(0)

    def r(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen, device=device, dtype=dtype) * 0.02

    t = {"model.embed_tokens.weight": r(vocab, hidden), "model.norm.weight": 1 + r(hidden)}
    if not tied:
        t["lm_head.weight"] = r(vocab, hidden)
    for i in range(cfg.num_layers):
        p = f"model.layers.{i}."
        t |= {
            p + "input_layernorm.weight": 1 + r(hidden), p + "post_attention_layernorm.weight": 1 + r(hidden),
            p + "self_attn.q_proj.weight": r(heads * hd, hidden), p + "self_attn.k_proj.weight": r(kv * hd, hidden),
            p + "self_attn.v_proj.weight": r(kv * hd, hidden), p + "self_attn.o_proj.weight": r(hidden, heads * hd),
            p + "mlp.gate_proj.weight": r(inter, hidden), p + "mlp.up_proj.weight": r(inter, hidden),
            p + "mlp.down_proj.weight": r(hidden, inter),
        }
    return LlamaWeights(cfg, t, dtype, device, pack=pack)


def variants(w: LlamaWeights, context: int, cuda: bool, plain: LlamaWeights, pieces: bool) -> dict[str, LeanLlamaLM]:
    """eager: unpadded passes. graphs: rows buckets, compiled layers (in a CUDA graph on CUDA), over
    ``plain`` (the same weights, no matrix packed for oneDNN: compiled layers cannot read packed ones).
    pieces (asked for): graphs with each layer compiled as two pieces, the KV write between them.
    exact: every pass EXACT_ROWS rows (graphed on CUDA)."""
    def graphed(scope: str) -> LeanLlamaLM:
        capture = {} if cuda else {"capture": lambda step, rows, window: step}
        return LeanLlamaLM(plain, max_context=context, plan=ShapePlan(rows_buckets=GRAPH_ROWS), graphs=True,
                           ops=LayerOps.compiled(scope), **capture)

    return {
        "eager": LeanLlamaLM(w, max_context=context),
        "graphs": graphed("layer"),
        **({"pieces": graphed("pieces")} if pieces else {}),
        "exact": LeanLlamaLM(w, max_context=context, plan=ShapePlan(exact_rows=EXACT_ROWS), graphs=cuda),
    }


def step_times(lm: LeanLlamaLM, context: int, ns: list[int], reps: int, device: str) -> dict[int, float]:
    """Seconds for one pass of n new tokens after ``context`` cached ones (logits of all n read)."""
    ids = [(31 * i + 7) % lm.vocab_size for i in range(context + max(ns))]
    s = lm.new_session()
    s.forward(ids[:context], 0)
    sync = synchronize(device)
    out = {}
    for n in ns:

        def one() -> None:
            s.truncate(context)
            s.forward(ids[context : context + n], n)
            sync()

        out[n] = median_s(one, reps)
    s.close()
    return out


def predicted_speedup(alpha: float, k: int, c: float, verify_ratio: float) -> float:
    """Leviathan et al. 2023, Thm 3.8, with the measured cost of verifying k + 1 tokens:
    E[tokens per iteration] / (k c + V(k+1)/V(1))."""
    tokens = k + 1.0 if alpha >= 1.0 else (1 - alpha ** (k + 1)) / (1 - alpha)
    return tokens / (k * c + verify_ratio)


def part_shapes(args: argparse.Namespace, device: str) -> dict:
    cuda = device.startswith("cuda")
    bw = copy_bandwidth(device)
    print(f"copy bandwidth {bw / 1e9:.0f} GB/s (read + written), context {args.context}, "
          f"{'graphs: compiled layers in CUDA graphs' if cuda else 'graphs column: compiled layers, no CUDA graph (CPU)'}")
    ns = list(range(1, 10))
    results: dict = {"bandwidth_GBps": bw / 1e9, "context": args.context, "shapes": {}}
    for name in args.shapes:
        say(f"[shapes] {name}: random weights")
        w = random_weights(name, args.layers, args.context + 32, torch.bfloat16, device)
        kv_bytes = 2 * w.cfg.num_layers * w.cfg.num_kv_heads * w.cfg.head_dim * args.context * 2
        floor = (w.nbytes() + kv_bytes) / bw
        row: dict = {"layers": w.cfg.num_layers, "weight_bytes": w.nbytes(), "floor_ms": floor * 1e3}
        # a second, plain copy only where the CPU packs bf16 matrices (twice the memory there)
        plain = random_weights(name, args.layers, args.context + 32, torch.bfloat16, device, pack=False) \
            if w.packed else w
        for mode, lm in variants(w, args.context + 32, cuda, plain, args.pieces).items():
            say(f"[shapes] {name}: {mode}")
            t = step_times(lm, args.context, ns if mode != "exact" else [1, 6], args.reps, device)
            row[mode] = {n: s * 1e3 for n, s in t.items()}
            if lm.graphs is not None:
                row[mode + "_capture"] = lm.graphs.stats.to_dict()
        results["shapes"][name] = row
        print(f"\n{name} ({row['layers']} layers, {row['weight_bytes'] / 1e9:.2f} GB): floor {floor * 1e3:.3f} ms")
        print("  n (ms) " + "".join(f"{n:>9}" for n in ns))
        for mode in [m for m in ("eager", "graphs", "pieces", "exact") if m in row]:
            print(f"  {mode:<7}" + "".join(f"{row[mode][n]:9.3f}" if n in row[mode] else " " * 9 for n in ns))
        for mode in ("graphs", "pieces", "exact"):
            if mode + "_capture" in row:
                cap = row[mode + "_capture"]
                print(f"  {mode} captured {cap['graphs']} shapes in {cap['capture_s']:.1f} s, "
                      f"{cap['memory_bytes'] / 1e6:.0f} MB")
        print(f"  step within {row['graphs'][1] / row['floor_ms']:.2f}x of the floor (graphs, n = 1)")
        del w
        if cuda:
            torch.cuda.empty_cache()
    results["speculation"] = speculation_figures(results["shapes"])
    return results


def speculation_figures(shapes: dict) -> dict:
    """c of the 135M shape against the larger ones, and Leviathan's predicted speedup (best k <= 8)."""
    out: dict = {}
    if "135m" not in shapes:
        return out
    draft = shapes["135m"]
    for target in [s for s in shapes if s != "135m"]:
        t = shapes[target]
        for mode in ("eager", "graphs"):
            c = draft[mode][1] / t[mode][1]
            v = {n: t[mode][n] / t[mode][1] for n in t[mode]}
            best = {a: max((predicted_speedup(a, k, c, v[k + 1]), k) for k in range(1, 9)) for a in ALPHAS}
            out[f"{target}_{mode}"] = {"c": c, "predicted": {a: {"speedup": s, "k": k} for a, (s, k) in best.items()}}
            print(f"\n135m draft for {target}, {mode}: c = {c:.3f}; predicted speedup "
                  + ", ".join(f"{s:.2f}x (alpha {a}, k {k})" for a, (s, k) in best.items()))
    return out


def part_pair(args: argparse.Namespace, device: str) -> dict:
    from trtspec.data import benchmark_prompts
    from trtspec.decoding import FixedDraftLength, GenerationRequest, StopCriteria
    from trtspec.runtime.demo import prepare_demo
    from trtspec.runtime.pair import load_pair

    paths = prepare_demo(progress=lambda m: say(f"[demo] {m}"))
    out: dict = {}
    for exact in (True, False):
        say(f"[pair] loading, exact {exact}")
        pair = load_pair(paths.target, paths.draft, target_precision="bf16", device=device, exact=exact,
                         progress=lambda m: say(f"[pair] {m}"))
        tok, dec = pair.target.tokenizer, pair.decoder()
        runs: dict[str, list] = {"alone": [], "speculative": []}
        prompts = benchmark_prompts()[: args.prompts]
        for i, text in enumerate([prompts[-1], *prompts]):  # the first, untimed: first-use costs of both modes
            req = GenerationRequest(tuple(tok.encode_prompt(text)), StopCriteria(args.max_tokens))  # no EOS: same work
            alone, spec = dec.generate(req, FixedDraftLength(0)), dec.generate(req, FixedDraftLength(args.k))
            if i > 0:
                runs["alone"].append(alone)
                runs["speculative"].append(spec)
        rate = {m: sum(r.stats.emitted_tokens for r in rs) / sum(r.stats.total_time_s for r in rs)
                for m, rs in runs.items()}
        same = sum(a.token_ids == b.token_ids for a, b in zip(runs["alone"], runs["speculative"], strict=True))
        drafted = sum(r.stats.drafted_tokens for r in runs["speculative"])
        accepted = sum(r.stats.accepted_tokens for r in runs["speculative"])
        key = "exact" if exact else "not_exact"
        out[key] = {"tokens_per_s": rate, "identical": same, "prompts": args.prompts,
                    "acceptance": accepted / drafted if drafted else None, "models": pair.describe()}
        print(f"\ndemo pair, bf16 target, INT8 draft, exact {exact}: target alone {rate['alone']:.1f} tok/s, "
              f"speculative k={args.k} {rate['speculative']:.1f} tok/s ({rate['speculative'] / rate['alone']:.2f}x), "
              f"identical {same}/{args.prompts}, acceptance {out[key]['acceptance'] or 0:.1%}")
        for role in ("target", "draft"):
            g = out[key]["models"][role]["graphs"]
            if g:
                print(f"  {role} graphs at load and after: {g['graphs']} shapes, {g['capture_s']:.1f} s, "
                      f"{g['memory_bytes'] / 1e6:.0f} MB")
        del pair, dec
    if "exact" in out and "not_exact" in out:
        for m in ("alone", "speculative"):
            cost = 1 - out["exact"]["tokens_per_s"][m] / out["not_exact"]["tokens_per_s"][m]
            print(f"exact mode costs {cost:.1%} of {m} tokens/s")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--part", choices=["shapes", "pair", "all"], default="all")
    ap.add_argument("--shapes", default="135m,1b,8b", help="comma-separated, of " + ",".join(SHAPES))
    ap.add_argument("--layers", type=int, default=None, help="cut every shape to this many layers (shortened runs)")
    ap.add_argument("--pieces", action="store_true",
                    help="also time graphs with each layer compiled as two pieces (the KV write between them)")
    ap.add_argument("--context", type=int, default=512, help="cached tokens before the timed pass")
    ap.add_argument("--reps", type=int, default=30, help="timed passes per figure (median)")
    ap.add_argument("--prompts", type=int, default=12)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--k", type=int, default=5)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--json-out", type=Path, default=None)
    args = ap.parse_args()
    args.shapes = [s for s in args.shapes.split(",") if s]
    bad = [s for s in args.shapes if s not in SHAPES]
    if bad:
        print(f"error: unknown shape {bad[0]!r}; choose from {', '.join(SHAPES)}", file=sys.stderr)
        return 2
    device = ("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device
    name = torch.cuda.get_device_name() if device.startswith("cuda") else cpu_name()
    print(f"device {device} ({name}), torch {torch.__version__}, threads {torch.get_num_threads()}")
    results: dict = {"device": name, "torch": torch.__version__}
    with torch.inference_mode():
        if args.part in ("shapes", "all"):
            results["shapes"] = part_shapes(args, device)
        if args.part in ("pair", "all"):
            results["pair"] = part_pair(args, device)
    write_json(args.json_out, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
