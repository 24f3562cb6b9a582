"""The torch runtimes: logits against transformers, KV rollback, int8, loading errors."""

from __future__ import annotations

import dataclasses
import json
import shutil

import pytest
import torch

from trtspec.builder.memory import kv_bytes_per_token
from trtspec.errors import CheckpointError, IncompatibleModelsError
from trtspec.runtime.pair import load_pair
from trtspec.runtime.torch import llama
from trtspec.runtime.torch.llama import (
    DEQUANT_ROWS,
    INT4_GROUP,
    Int4Weight,
    Int8Weight,
    LlamaConfig,
    LlamaWeights,
    _linear,
    cpu_bf16_matmul,
    cpu_packing,
    int4_weight,
    pack_cpu,
    quantize_int4,
    quantize_int8,
)
from trtspec.runtime.torch.loader import kv_cache_dtype, load_model, read_config, read_tensors


@pytest.fixture(scope="module")
def hf_target(tiny_target):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(tiny_target), dtype=torch.float32).eval()


def hf_logits(model, ids: list[int]) -> torch.Tensor:
    with torch.inference_mode():
        return model(torch.tensor([ids])).logits[0].float()


PROMPT = [5, 17, 33, 2, 99, 150, 7, 8, 9, 300, 11]


@pytest.mark.parametrize("impl", ["lean", "hf"])
def test_logits_match_transformers(tiny_target, hf_target, impl):
    m = load_model(tiny_target, "fp32", impl=impl)
    s = m.lm.new_session()
    ours = s.forward(PROMPT, len(PROMPT))  # [n, vocab]
    torch.testing.assert_close(ours, hf_logits(hf_target, PROMPT), atol=2e-4, rtol=1e-4)
    # then token by token (decode path) and several at once (verify path)
    more = [4, 40, 41, 42]
    step = s.forward(more[:1], 1)
    multi = s.forward(more[1:], 3)
    ref = hf_logits(hf_target, PROMPT + more)
    torch.testing.assert_close(step[0], ref[len(PROMPT)], atol=2e-4, rtol=1e-4)
    torch.testing.assert_close(multi, ref[-3:], atol=2e-4, rtol=1e-4)


@pytest.mark.skipif(not cpu_packing(), reason="this torch has no oneDNN (mkldnn)")
def test_cpu_fp32_matrices_run_packed_and_a_row_does_not_depend_on_the_others(tiny_target):
    w = load_model(tiny_target, "fp32", impl="lean").lm.weights
    assert w.layers[0].w_qkv.is_mkldnn and w.layers[-1].w_down.is_mkldnn and w.lm_head.is_mkldnn
    assert not w.embed.is_mkldnn  # the lookup wants the plain matrix
    assert not load_model(tiny_target, "fp16", impl="lean").lm.weights.layers[0].w_qkv.is_mkldnn
    bf16_packed = cpu_bf16_matmul() and llama.onednn_bf16()
    assert load_model(tiny_target, "bf16", impl="lean").lm.weights.layers[0].w_qkv.is_mkldnn == bf16_packed
    g = torch.Generator().manual_seed(0)
    m, x = torch.randn(300, 64, generator=g), torch.randn(6, 64, generator=g)
    six = _linear(x, pack_cpu(m))
    torch.testing.assert_close(six, x @ m.T, atol=1e-5, rtol=1e-5)
    assert torch.equal(_linear(x[:1], pack_cpu(m))[0], six[0])
    assert torch.equal(_linear(x[[3, 0, 1, 2, 4, 5]], pack_cpu(m))[0], six[3])


def test_compiled_layers_need_plain_matrices_and_pack_false_keeps_them(tiny_target):
    from trtspec.runtime.torch.lean import LeanLlamaLM
    from trtspec.runtime.torch.llama import LayerOps, LlamaConfig, LlamaWeights
    from trtspec.runtime.torch.loader import read_tensors

    cfg, tensors = LlamaConfig.from_hf(read_config(tiny_target)), read_tensors(tiny_target)
    packed = LlamaWeights(cfg, tensors, torch.float32, "cpu")
    plain = LlamaWeights(cfg, tensors, torch.float32, "cpu", pack=False)
    assert packed.packed == cpu_packing() and not plain.packed
    assert not plain.layers[0].w_qkv.is_mkldnn and not plain.lm_head.is_mkldnn
    if packed.packed:  # a clear error, not inductor's "Cannot access storage of OpaqueTensorImpl" at the first pass
        with pytest.raises(ValueError, match="compiled layers cannot read packed matrices"):
            LeanLlamaLM(packed, ops=LayerOps.compiled())
    LeanLlamaLM(plain, ops=LayerOps.compiled())  # builds (compiling waits for the first pass)


@pytest.mark.skipif(not cpu_packing(), reason="this torch has no oneDNN (mkldnn)")
@pytest.mark.parametrize("bf16_in_hardware", [True, False])
def test_bf16_matrices_run_packed_where_the_cpu_multiplies_bf16(monkeypatch, tiny_target, bf16_in_hardware):
    """Packed or not, a bf16 model computes the same logits (to bf16's precision), and in exact mode a
    row's logits still do not depend on its pass. (Forced either way: oneDNN runs bf16, emulated, on any
    AVX-512 CPU, so both paths are checked there; where it runs no bf16, nothing is packed.)"""
    monkeypatch.setattr(llama, "_CPU_BF16", bf16_in_hardware)
    lm = load_model(tiny_target, "bf16").lm
    packed = bf16_in_hardware and llama.onednn_bf16()
    assert lm.weights.layers[0].w_gate_up.is_mkldnn == lm.weights.lm_head.is_mkldnn == packed
    monkeypatch.setattr(llama, "_CPU_BF16", not bf16_in_hardware)
    other = load_model(tiny_target, "bf16").lm
    torch.testing.assert_close(lm.new_session().forward(PROMPT, len(PROMPT)),
                               other.new_session().forward(PROMPT, len(PROMPT)), atol=2e-2, rtol=2e-2)
    monkeypatch.setattr(llama, "_CPU_BF16", bf16_in_hardware)
    exact = load_model(tiny_target, "bf16", exact=True).lm
    one, six = exact.new_session(), exact.new_session()
    one.forward(PROMPT, 0)
    six.forward(PROMPT, 0)
    assert torch.equal(one.forward([5], 1)[0], six.forward([5, 6, 7, 8, 9, 10], 6)[0])


@pytest.mark.parametrize("impl", ["lean", "hf"])
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_rollback_equals_fresh_prefill(tiny_target, impl, precision):
    m = load_model(tiny_target, precision, impl=impl)
    a = m.lm.new_session()
    a.forward(PROMPT, 0)
    a.forward([1, 2, 3, 4, 5], 5)  # draft tokens, then reject the last 4
    a.truncate(len(PROMPT) + 1)
    assert a.num_cached == len(PROMPT) + 1
    after_rollback = a.forward([77, 78], 2)
    b = m.lm.new_session()
    fresh = b.forward(PROMPT + [1, 77, 78], 2)
    tol = 1e-5 if precision == "fp32" else 2e-2
    torch.testing.assert_close(after_rollback, fresh, atol=tol, rtol=tol)


def test_kv_cache_grows_past_its_initial_capacity(tiny_target):
    m = load_model(tiny_target, "fp32")
    m.lm.initial_capacity = 8
    s = m.lm.new_session()
    ids = list(range(3, 60))
    out = torch.cat([s.forward(ids[:5], 5), s.forward(ids[5:30], 25), s.forward(ids[30:], len(ids) - 30)])
    fresh = m.lm.new_session().forward(ids, len(ids))
    torch.testing.assert_close(out, fresh, atol=1e-5, rtol=1e-5)


def test_the_cpu_caches_in_float32_and_the_build_plans_for_it(tiny_target):
    """Every lean model attends over a float32 cache on the CPU (``llama.kv_dtype``: torch's attention
    over a bf16 cache costs several times as much per key for one row), on the GPU over its compute
    dtype; the memory plan counts the cache the runtime allocates (``kv_cache_dtype``)."""
    cfg = read_config(tiny_target)
    for precision in ("fp32", "bf16", "fp16", "int8", "int4"):
        cache = load_model(tiny_target, precision).lm.new_cache(8)
        assert cache.k.dtype == cache.v.dtype == torch.float32, precision
        assert kv_cache_dtype(cfg, precision, "cpu") == torch.float32
        assert cache.nbytes() == 8 * kv_bytes_per_token(cfg, kv_cache_dtype(cfg, precision, "cpu").itemsize)
    assert kv_cache_dtype(cfg, "int8", "cuda") == kv_cache_dtype(cfg, "bf16", "cuda:0") == torch.bfloat16
    assert kv_cache_dtype(cfg, "fp16", "cuda") == torch.float16
    assert kv_cache_dtype({**cfg, "architectures": ["GPT2LMHeadModel"]}, "bf16", "cpu") == torch.bfloat16  # HF's cache


def test_quantize_int8_roundtrip_and_idempotence():
    w = torch.randn(64, 32)
    q, scale = quantize_int8(w)
    assert q.dtype == torch.int8 and scale.shape == (64,)
    assert int(q.abs().max()) == 127
    deq = q.float() * scale[:, None]
    assert float((deq - w).abs().max()) <= float(scale.max()) / 2 + 1e-6  # half a step
    q2, scale2 = quantize_int8(deq)  # re-quantizing dequantized weights is exact
    assert torch.equal(q, q2)
    torch.testing.assert_close(scale, scale2)


def q4_1_grid(out: int, inp: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Weights as a Q4_1 GGUF holds them, dequantized: per group of 32, ``d * q + m`` with every q
    in 0..15 used at its ends (0 and 15 present); returns (w, q, d, m)."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randint(0, 16, (out, inp), generator=g)
    q.view(out, -1, INT4_GROUP)[..., 0], q.view(out, -1, INT4_GROUP)[..., 1] = 0, 15
    d = torch.rand(out, inp // INT4_GROUP, generator=g) * 0.01 + 1e-3
    m = -8 * d + torch.randn(out, inp // INT4_GROUP, generator=g) * 1e-3
    w = (q.view(out, -1, INT4_GROUP) * d[..., None] + m[..., None]).reshape(out, inp)
    return w, q, d, m


def test_quantize_int4_recovers_a_q4_1_grid_and_stays_within_half_a_step():
    w, q, d, m = q4_1_grid(48, 96)
    q4, scale, zero = quantize_int4(w)
    assert torch.equal(q4, q.int())  # a Q4_1 GGUF's weights come back as its own codes
    torch.testing.assert_close(scale, d)
    torch.testing.assert_close(zero, m + 8 * d)
    r = torch.randn(48, 96)
    q4, scale, zero = quantize_int4(r)
    assert int(q4.min()) == 0 and int(q4.max()) == 15
    deq = ((q4.view(48, -1, INT4_GROUP) - 8) * scale[..., None] + zero[..., None]).reshape(48, 96)
    step = scale.repeat_interleave(INT4_GROUP, dim=1)
    assert bool(((deq - r).abs() <= step / 2 + 1e-6).all())


def test_int4_matmul_is_the_dequantized_product():
    w, q, d, m = q4_1_grid(64, 128, seed=1)
    x = torch.randn(5, 128).bfloat16()
    y = _linear(x, int4_weight(w, "w", torch.bfloat16))
    assert y.dtype == torch.bfloat16 and y.shape == (5, 64)
    # the reference: the grid's weights with scale and zero rounded to bf16, as the kernel holds them
    sz = torch.stack([d, m + 8 * d], -1).bfloat16().float()
    deq = ((q.view(64, -1, INT4_GROUP) - 8) * sz[..., 0:1] + sz[..., 1:2]).reshape(64, 128)
    torch.testing.assert_close(y.float(), x.float() @ deq.T, atol=0.02, rtol=0.02)


def test_int4_refuses_what_its_kernel_cannot_take(tiny_target):
    with pytest.raises(CheckpointError, match=r"q_proj is \[40, 64\].*use int8"):
        int4_weight(torch.randn(40, 64), "q_proj", torch.bfloat16)
    with pytest.raises(CheckpointError, match=r"inputs a multiple of 32; w is \[64, 48\]"):
        int4_weight(torch.randn(64, 48), "w", torch.bfloat16)
    cfg = LlamaConfig.from_hf(read_config(tiny_target))
    with pytest.raises(CheckpointError, match="int4 weight-only runs on the CPU.*on cuda use int8"):
        LlamaWeights(cfg, read_tensors(tiny_target), torch.bfloat16, "cuda", quant="int4")


def test_int4_unfit_names_the_matrix_or_the_cpu(tiny_target, monkeypatch):
    cfg = LlamaConfig.from_hf(read_config(tiny_target))
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX2")
    assert llama.int4_unfit(cfg) is None
    odd = dataclasses.replace(cfg, intermediate_size=cfg.intermediate_size + 16)
    assert llama.int4_unfit(odd) == (f"int4 needs each layer matrix's outputs a multiple of 16 and its inputs a "
                                     f"multiple of 32; down_proj is [{cfg.hidden_size}, {odd.intermediate_size}] (use int8)")
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "DEFAULT")
    assert "kernels are DEFAULT" in llama.int4_unfit(cfg)


def test_int4_model_runs_its_grid_with_int8_embedding_and_head(tiny_target, tmp_path):
    """A checkpoint already on int4 grids (as a Q4_1 GGUF's): the int4 model holds those weights as they
    are, so it is closer to the float model than the int8 one, which rounds them again."""
    from safetensors.torch import save_file

    tensors = {}
    for name, t in read_tensors(tiny_target).items():
        if name.startswith(llama.LAYERS) and t.dim() == 2:
            q4, scale, zero = quantize_int4(t)
            t = ((q4.view(t.shape[0], -1, INT4_GROUP) - 8) * scale[..., None] + zero[..., None]).reshape(t.shape)
        tensors[name] = t.contiguous()
    for f in tiny_target.iterdir():
        if f.suffix != ".safetensors":
            shutil.copy(f, tmp_path / f.name)
    save_file(tensors, str(tmp_path / "model.safetensors"))
    fp, i4 = load_model(tmp_path, "fp32"), load_model(tmp_path, "int4")
    w = i4.lm.weights
    assert i4.precision == "int4"
    assert all(isinstance(getattr(layer, n), Int4Weight) for layer in w.layers
               for n in ("w_qkv", "w_o", "w_gate_up", "w_down"))
    assert isinstance(w.embed, Int8Weight) and isinstance(w.lm_head, Int8Weight)
    i8 = load_model(tmp_path, "int8")
    assert i4.weight_bytes < i8.weight_bytes
    a, b, c = (m.lm.new_session().forward(PROMPT, len(PROMPT)) for m in (fp, i4, i8))
    assert (a.argmax(-1) == b.argmax(-1)).float().mean() >= 0.8
    assert float((b - a).abs().mean()) < float((c - a).abs().mean())


def test_int8_model_is_a_close_copy(tiny_target):
    fp = load_model(tiny_target, "fp32")
    i8 = load_model(tiny_target, "int8")
    assert i8.precision == "int8"
    assert i8.weight_bytes < fp.weight_bytes / 3.5  # int8 + scales vs float32
    a = fp.lm.new_session().forward(PROMPT, len(PROMPT))
    b = i8.lm.new_session().forward(PROMPT, len(PROMPT))
    agree = (a.argmax(-1) == b.argmax(-1)).float().mean()
    assert agree >= 0.8


@pytest.mark.parametrize("bf16_in_hardware", [True, False])
def test_a_long_int8_pass_dequantizes_only_where_bf16_is_in_hardware(monkeypatch, bf16_in_hardware):
    calls = []
    int8pack = llama._int8pack_mm
    monkeypatch.setattr(llama, "_int8pack_mm", lambda *a: calls.append(a[0].shape[0]) or int8pack(*a))
    monkeypatch.setattr(llama, "_CPU_BF16", bf16_in_hardware)
    g = torch.Generator().manual_seed(0)
    q, scale = quantize_int8(torch.randn(96, 64, generator=g))
    w = Int8Weight(q, scale.bfloat16())
    x = torch.randn(DEQUANT_ROWS, 64, generator=g).bfloat16()
    long, short = _linear(x, w), _linear(x[:DEQUANT_ROWS - 1], w)
    assert calls == ([DEQUANT_ROWS - 1] if bf16_in_hardware else [DEQUANT_ROWS, DEQUANT_ROWS - 1])
    exact = x.float() @ (q.float() * scale[:, None]).T
    for y, rows in ((long, DEQUANT_ROWS), (short, DEQUANT_ROWS - 1)):  # either way, the same product (bf16)
        assert y.dtype == torch.bfloat16
        torch.testing.assert_close(y.float(), exact[:rows], atol=0.05, rtol=0.02)


def test_missing_checkpoint_is_a_clear_error(tmp_path):
    with pytest.raises(CheckpointError, match="checkpoint not found"):
        load_model(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match="config.json is missing"):
        load_model(tmp_path / "empty")
    (tmp_path / "weights.bin").write_bytes(b"x")
    with pytest.raises(CheckpointError, match="not a .gguf"):
        load_model(tmp_path / "weights.bin")


def test_checkpoint_without_weights_is_a_clear_error(tiny_target, tmp_path):
    broken = tmp_path / "broken"
    shutil.copytree(tiny_target, broken)
    for f in broken.glob("*.safetensors"):
        f.unlink()
    with pytest.raises(CheckpointError, match="no .safetensors"):
        load_model(broken)


def test_vocabulary_mismatch_names_the_mismatch(tiny_target, tmp_path):
    from trtspec.testing.tiny import make_tiny_llama

    other = make_tiny_llama(tmp_path / "other", seed=3, vocab_size=500)  # logits 500 wide
    with pytest.raises(IncompatibleModelsError, match="vocabulary size mismatch: target logits have 384 entries, draft has 500"):
        load_pair(tiny_target, other)


def test_tokenizer_mismatch_names_the_mismatch(tiny_target, tiny_draft, tmp_path):
    changed = tmp_path / "changed"
    shutil.copytree(tiny_draft, changed)
    tj = json.loads((changed / "tokenizer.json").read_text())
    vocab = tj["model"]["vocab"]
    a, b = sorted(vocab, key=vocab.get)[100:102]
    vocab[a], vocab[b] = vocab[b], vocab[a]  # two ids swapped
    (changed / "tokenizer.json").write_text(json.dumps(tj))
    with pytest.raises(IncompatibleModelsError, match="disagree|vocabularies differ"):
        load_pair(tiny_target, changed)
