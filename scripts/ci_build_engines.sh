#!/usr/bin/env bash
# CI job: build the engines and model repository for one draft/target pair (or
# a target alone), check what was built, and pack it for deployment.
#
# Runs on a GPU runner inside the trtspec image (see Dockerfile) for
# BACKEND=trtllm, on any runner for BACKEND=torch. Settings come from the
# environment:
#
#   TARGET, DRAFT     checkpoints (HF dirs or .gguf); or DEMO=1 for the demo pair.
#                     No DRAFT: the target alone, drafting with ngram/suffix (BACKEND=torch)
#   DEFAULT_DRAFTER   model | ngram | suffix | auto  (default: model with a draft, ngram without)
#   NAME              engines/<NAME> (default: the target dir's name, or "demo")
#   BACKEND           torch | trtllm                 (default: trtllm)
#   DRAFT_QUANT       int8 | none                    (default: int8)
#   MAX_DRAFT_LEN     draft tokens per iteration     (default: 5)
#   MAX_SESSIONS      sequences the KV pools hold    (default: 8)
#   MAX_CONTEXT       tokens per sequence            (default: what both models allow)
#   POLICY            control-plane policy file      (optional)
#   DEVICE_MEMORY     plan for this device size, e.g. 80GiB (needed with DRY_RUN=1 on a GPU-less runner)
#   OUT               output directory               (default: ./build-out)
#   DRY_RUN=1         print the commands and configs; build nothing
#   MIN_ACCEPTANCE    fail when the INT8 draft's greedy acceptance is below this (default: 0.5)
#
# Writes OUT/engines/<NAME>/, OUT/model_repo/, OUT/build.json and, unless
# DRY_RUN, OUT/<NAME>-engines.tar.gz. Re-running with unchanged inputs
# rebuilds nothing (the manifest's input hash says so).
set -euo pipefail

BACKEND="${BACKEND:-trtllm}"
DRAFT_QUANT="${DRAFT_QUANT:-int8}"
MAX_DRAFT_LEN="${MAX_DRAFT_LEN:-5}"
MAX_SESSIONS="${MAX_SESSIONS:-8}"
OUT="${OUT:-build-out}"
MIN_ACCEPTANCE="${MIN_ACCEPTANCE:-0.5}"
mkdir -p "$OUT"

args=(build --backend "$BACKEND" --draft-quant "$DRAFT_QUANT" --max-draft-len "$MAX_DRAFT_LEN"
      --max-sessions "$MAX_SESSIONS" --engines "$OUT/engines" --model-repo "$OUT/model_repo" --json)
if [[ "${DEMO:-0}" == 1 ]]; then
    args+=(--demo)
else
    : "${TARGET:?set TARGET (and DRAFT), or DEMO=1}"
    args+=(--target "$TARGET")
    [[ -n "${DRAFT:-}" ]] && args+=(--draft "$DRAFT")
fi
[[ -n "${DEFAULT_DRAFTER:-}" ]] && args+=(--default-drafter "$DEFAULT_DRAFTER")
[[ -n "${NAME:-}" ]] && args+=(--name "$NAME")
[[ -n "${MAX_CONTEXT:-}" ]] && args+=(--max-context "$MAX_CONTEXT")
[[ -n "${POLICY:-}" ]] && args+=(--policy "$POLICY")
[[ -n "${DEVICE_MEMORY:-}" ]] && args+=(--device-memory "$DEVICE_MEMORY")
[[ "${DRY_RUN:-0}" == 1 ]] && args+=(--dry-run)

echo "+ trtspec ${args[*]}" >&2
trtspec "${args[@]}" > "$OUT/build.json"

# Summarize, check the INT8 draft did not lose too much, and (for a real build)
# check the engines against this machine the way the server will.
python3 - "$OUT/build.json" "$MIN_ACCEPTANCE" <<'PY'
import json
import sys

from trtspec.builder.manifest import verify_engines

result = json.load(open(sys.argv[1]))
floor = float(sys.argv[2])
print(f"build {result['name']!r} ({result['backend']}), reused={result['reused']}, dry_run={result['dry_run']}")
print(f"  {'a draft model' if result['draft_model'] else 'no draft model'}; default drafter {result['default_drafter']}")
for step in result["steps"]:
    print(f"  {step['name']:<10} {step['status']:<8} {step['seconds']:>8.1f}s  {step['detail']}")
q = result["quantization"]
if q:
    print(f"  draft weights {q['weight_bytes_before'] / 2**20:.1f} MiB -> {q['weight_bytes_after'] / 2**20:.1f} MiB")
    before, after = q["acceptance_before"], q["acceptance_after"]
    if before and after:
        print(f"  greedy acceptance {before['acceptance_rate']:.1%} -> {after['acceptance_rate']:.1%}")
        if after["acceptance_rate"] is not None and after["acceptance_rate"] < floor:
            sys.exit(f"INT8 draft acceptance {after['acceptance_rate']:.1%} is below MIN_ACCEPTANCE {floor:.0%}")
plan = result["memory_plan"]
print(f"  memory: {plan['sessions']} sessions x {plan['tokens_per_sequence']} tokens on {plan['device']['name']}")
for role in [r for r in ("target", "draft") if plan[r]]:  # no draft model: target only
    s = plan[role]
    print(f"    {role}: kv_cache_free_gpu_mem_fraction={s['kv_cache_free_gpu_mem_fraction']} "
          f"max_tokens_in_paged_kv_cache={s['max_tokens_in_paged_kv_cache']}")
if not result["dry_run"]:
    from pathlib import Path

    verify_engines(Path(result["engine_dir"]), result["backend"])
    print("  manifest verified against this machine")
PY

if [[ "${DRY_RUN:-0}" != 1 ]]; then
    name="$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["name"])' "$OUT/build.json")"
    tar -C "$OUT" -czf "$OUT/$name-engines.tar.gz" "engines/$name" model_repo
    echo "packed $OUT/$name-engines.tar.gz" >&2
fi
