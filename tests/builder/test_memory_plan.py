"""The memory-pool planner: arithmetic with plain numbers, and the readers against real checkpoints."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trtspec.builder.errors import BuildError, MemoryPlanError
from trtspec.builder.memory import (
    GiB,
    MiB,
    DeviceMemory,
    MemoryPlan,
    ModelFootprint,
    checkpoint_head_tied,
    kv_bytes_per_token,
    parse_bytes,
    plan_memory,
    read_device_memory,
    runtime_weight_bytes,
)
from trtspec.builder.quantize import write_quantized_checkpoint
from trtspec.runtime.torch.loader import argmax_head_bytes, load_model, read_config, weights_packed

H100 = DeviceMemory("gpu", "H100 80GB", 80 * GiB, "test")
# Llama-3-8B-ish target (bf16) and a Llama-3.2-1B-ish W8A16 draft.
TARGET = ModelFootprint("target", weight_bytes=16 * GiB, kv_bytes_per_token=32 * 2 * 8 * 128 * 2, overhead_bytes=GiB)
DRAFT = ModelFootprint("draft", weight_bytes=int(1.5 * GiB), kv_bytes_per_token=16 * 2 * 8 * 64 * 2, overhead_bytes=GiB)


def trtllm_pools(plan: MemoryPlan, order: tuple[str, str], fraction_only: float | None = None) -> dict[str, int]:
    """What TensorRT-LLM allocates when the models load in ``order``.

    Each model, once its weights and workspace are in, takes
    ``min(max_tokens_in_paged_kv_cache * kv_per_token, fraction * free)``.
    ``fraction_only``: the usual setting without a token cap, for contrast.
    """
    shares = {"target": plan.target, "draft": plan.draft}
    used, pools = 0, {}
    for role in order:
        s = shares[role]
        used += s.weight_bytes + s.overhead_bytes
        free = plan.device.total_bytes - used
        if fraction_only is not None:
            pool = int(fraction_only * free)
        else:
            pool = min(s.max_tokens_in_paged_kv_cache * s.kv_bytes_per_token,
                       int(s.kv_cache_free_gpu_mem_fraction * free))
        pools[role] = pool
        used += pool
    return pools


def test_kv_bytes_per_token_from_a_config() -> None:
    smollm2 = {"num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3,
               "hidden_size": 576, "head_dim": 64}
    assert kv_bytes_per_token(smollm2, 2) == 30 * 2 * 3 * 64 * 2  # 23040
    no_gqa = {"num_hidden_layers": 2, "num_attention_heads": 4, "hidden_size": 64}
    assert kv_bytes_per_token(no_gqa, 4) == 2 * 2 * 4 * 16 * 4


def test_plan_when_memory_is_the_limit() -> None:
    plan = plan_memory(H100, TARGET, DRAFT, max_context=8192, max_sessions=64, max_draft_len=5,
                       headroom_fraction=0.10, tokens_per_block=32)
    assert plan.tokens_per_sequence == 8224  # 8192 + 5 rounded up to 32-token blocks
    assert plan.sessions < 64 and plan.notes  # 64 full 8k sequences do not fit: said so
    assert plan.target.kv_tokens % 32 == 0 and plan.target.kv_tokens == plan.draft.kv_tokens
    assert plan.target.kv_bytes == plan.target.kv_tokens * TARGET.kv_bytes_per_token
    # nothing beyond the usable memory is planned, and less than one token slot is left over
    usable = H100.total_bytes - plan.headroom_bytes
    assert plan.used_bytes <= usable
    assert plan.spare_bytes < 32 * (TARGET.kv_bytes_per_token + DRAFT.kv_bytes_per_token)
    assert 0 < plan.draft.kv_cache_free_gpu_mem_fraction < plan.target.kv_cache_free_gpu_mem_fraction <= 0.95


def test_plan_when_sessions_are_the_limit() -> None:
    plan = plan_memory(H100, TARGET, DRAFT, max_context=4096, max_sessions=4, max_draft_len=5, tokens_per_block=32)
    assert plan.sessions == 4 and not plan.notes
    assert plan.target.max_tokens_in_paged_kv_cache == 4 * plan.tokens_per_sequence
    assert plan.spare_bytes > 0


@pytest.mark.parametrize("sessions, context", [(64, 8192), (4, 4096), (1, 32768)])
def test_split_does_not_depend_on_load_order(sessions: int, context: int) -> None:
    plan = plan_memory(H100, TARGET, DRAFT, max_context=context, max_sessions=sessions, max_draft_len=5,
                       tokens_per_block=32)
    planned = {"target": plan.target.kv_bytes, "draft": plan.draft.kv_bytes}
    assert trtllm_pools(plan, ("target", "draft")) == planned
    assert trtllm_pools(plan, ("draft", "target")) == planned


def test_without_a_draft_the_target_gets_the_whole_budget() -> None:
    alone = plan_memory(H100, TARGET, None, max_context=8192, max_sessions=64, max_draft_len=5, tokens_per_block=32)
    pair = plan_memory(H100, TARGET, DRAFT, max_context=8192, max_sessions=64, max_draft_len=5, tokens_per_block=32)
    assert alone.draft is None and alone.shares == (alone.target,)
    assert alone.to_dict()["draft"] is None and list(alone.trtllm_settings()) == ["target"]
    assert alone.tokens_per_sequence == 8224  # the target still verifies k drafted tokens past the context
    assert alone.target.kv_tokens > pair.target.kv_tokens  # no draft weights, overhead or KV to hold
    usable = H100.total_bytes - alone.headroom_bytes
    assert alone.used_bytes <= usable and alone.spare_bytes < 32 * TARGET.kv_bytes_per_token
    free = H100.total_bytes - TARGET.weight_bytes - TARGET.overhead_bytes
    assert alone.target.kv_cache_free_gpu_mem_fraction * free >= alone.target.kv_bytes  # the token cap binds


def test_a_target_alone_that_does_not_fit_says_so() -> None:
    small = DeviceMemory("gpu", "T4", 16 * GiB, "test")
    with pytest.raises(MemoryPlanError, match=r"weights 16.00 GiB \(target\) \+ overhead 1.00 GiB exceed"):
        plan_memory(small, TARGET, None, max_context=4096, max_sessions=1, max_draft_len=5)


def test_a_fraction_alone_would_depend_on_load_order() -> None:
    # The contrast that motivates the token cap: the same 0.45 gives different pools per order.
    plan = plan_memory(H100, TARGET, DRAFT, max_context=8192, max_sessions=64, max_draft_len=5)
    a = trtllm_pools(plan, ("target", "draft"), fraction_only=0.45)
    b = trtllm_pools(plan, ("draft", "target"), fraction_only=0.45)
    assert a["target"] != b["target"] and a["draft"] != b["draft"]


@settings(max_examples=200, deadline=None)
@given(
    total_gib=st.integers(8, 192),
    t_w=st.integers(1, 100_000), d_w=st.integers(1, 20_000),  # MiB
    t_kv=st.integers(1_000, 400_000), d_kv=st.integers(500, 100_000),  # bytes per token
    context=st.integers(128, 32768), sessions=st.integers(1, 256), k=st.integers(1, 10),
)
def test_any_plan_that_fits_is_order_independent(
    total_gib: int, t_w: int, d_w: int, t_kv: int, d_kv: int, context: int, sessions: int, k: int
) -> None:
    dev = DeviceMemory("gpu", "any", total_gib * GiB, "test")
    t = ModelFootprint("target", t_w * MiB, t_kv, GiB)
    d = ModelFootprint("draft", d_w * MiB, d_kv, GiB)
    try:
        plan = plan_memory(dev, t, d, context, sessions, k, tokens_per_block=32)
    except MemoryPlanError:
        return  # refusing is allowed; a wrong split is not
    planned = {"target": plan.target.kv_bytes, "draft": plan.draft.kv_bytes}
    assert plan.sessions >= 1 and plan.used_bytes + plan.headroom_bytes <= dev.total_bytes
    assert trtllm_pools(plan, ("target", "draft")) == planned == trtllm_pools(plan, ("draft", "target"))


def test_weights_that_do_not_fit_are_refused_with_the_numbers() -> None:
    small = DeviceMemory("gpu", "T4", 16 * GiB, "test")
    with pytest.raises(MemoryPlanError, match=r"do not fit in T4 \(16.00 GiB\).*16.00 GiB \(target\)"):
        plan_memory(small, TARGET, DRAFT, max_context=4096, max_sessions=1, max_draft_len=5)


def test_a_context_too_long_for_the_kv_budget_is_refused() -> None:
    dev = DeviceMemory("gpu", "L4", 24 * GiB, "test")
    with pytest.raises(MemoryPlanError, match="not even one sequence fits.*--max-context"):
        plan_memory(dev, TARGET, DRAFT, max_context=1_000_000, max_sessions=1, max_draft_len=5)


def test_bad_arguments() -> None:
    with pytest.raises(BuildError, match="headroom"):
        plan_memory(H100, TARGET, DRAFT, 4096, 1, 5, headroom_fraction=1.0)
    with pytest.raises(BuildError, match="sessions"):
        plan_memory(H100, TARGET, DRAFT, 4096, 0, 5)


def test_parse_bytes() -> None:
    assert parse_bytes("80GiB") == 80 * GiB
    assert parse_bytes("512 MiB") == 512 * MiB
    assert parse_bytes("24GB") == 24 * 10**9
    assert parse_bytes("1.5GiB") == int(1.5 * GiB)
    assert parse_bytes("4096") == 4096
    for bad in ("lots", "12XB", "-1GiB", "0"):
        with pytest.raises(BuildError, match="cannot read a size"):
            parse_bytes(bad)


def test_reads_host_memory() -> None:
    mem = read_device_memory("cpu")
    assert mem.kind == "cpu" and mem.total_bytes > 256 * MiB and mem.source in ("/proc/meminfo", "psutil")


@pytest.fixture(scope="module")
def unflagged_tied(tied_target: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tied target whose config does not say so: the weights hold no LM head, the runtime ties it."""
    out = tmp_path_factory.mktemp("unflagged")
    for f in tied_target.iterdir():
        shutil.copy(f, out / f.name)
    cfg = read_config(tied_target)
    (out / "config.json").write_text(json.dumps({**cfg, "tie_word_embeddings": False}))
    return out


@pytest.mark.parametrize("head", ["own", "tied", "tied, config unflagged"])
@pytest.mark.parametrize("precision", ["fp32", "bf16", "int8", "int4"])
def test_weight_bytes_from_headers_match_what_the_runtime_holds(
    tiny_target, tied_target, unflagged_tied, precision, head
) -> None:
    """A tied LM head is held twice where the matrices are packed (fp32 on the CPU; bf16 where it packs),
    and a float32 one's bfloat16 copy too where greedy passes read it (``ArgmaxHead``); a checkpoint
    without an LM head is tied whatever its config says."""
    path = {"own": tiny_target, "tied": tied_target, "tied, config unflagged": unflagged_tied}[head]
    cfg = read_config(path)
    model = load_model(path, precision, device="cpu")
    tied = checkpoint_head_tied(path, cfg)
    assert tied == (head != "own")
    planned = runtime_weight_bytes(path, cfg, precision, packed=weights_packed(cfg, precision, "cpu"))
    assert planned + argmax_head_bytes(cfg, precision, "cpu", tied) == model.weight_bytes


@pytest.mark.parametrize("stored", ["int8", "int4"])
def test_weight_bytes_of_a_quantized_checkpoint(tiny_draft: Path, tmp_path: Path, stored: str) -> None:
    """What the plan counts for a written int8 / int4 checkpoint is what the runtime holds, at the
    checkpoint's own precision and dequantized to float32."""
    q = write_quantized_checkpoint(tiny_draft, tmp_path / "q", stored).path
    cfg = read_config(q)
    held = load_model(q).weight_bytes
    assert runtime_weight_bytes(q, cfg, stored) == held == runtime_weight_bytes(tiny_draft, cfg, stored)
    packed = weights_packed(cfg, "fp32", "cpu")
    tied = checkpoint_head_tied(q, cfg)
    fp32 = runtime_weight_bytes(q, cfg, "fp32", packed=packed) + argmax_head_bytes(cfg, "fp32", "cpu", tied)
    assert fp32 == load_model(q, "fp32").weight_bytes


def test_trtllm_w8a16_keeps_embedding_and_head_in_16_bits(tiny_target: Path) -> None:
    cfg = read_config(tiny_target)
    plain = runtime_weight_bytes(tiny_target, cfg, "int8")
    w8a16 = runtime_weight_bytes(tiny_target, cfg, "int8", int8_exclude=("embed_tokens", "lm_head"))
    vocab, hidden = cfg["vocab_size"], cfg["hidden_size"]
    # embedding and LM head: 2 bytes per weight instead of 1 + a 2-byte scale per row
    assert w8a16 - plain == 2 * (vocab * hidden - 2 * vocab)
