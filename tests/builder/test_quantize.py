"""The INT8 and INT4 draft artefacts and the measurement of what quantization cost."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from trtspec.builder.errors import BuildError
from trtspec.builder.manifest import sha256_file
from trtspec.builder.quantize import (
    ProbeSettings,
    load_probe_prompts,
    measure_quantization,
    write_quantized_checkpoint,
)
from trtspec.runtime.torch import llama
from trtspec.runtime.torch.llama import INT4_GROUP, Int4Weight, quantize_int4, quantize_int8, unpack_int4_codes
from trtspec.runtime.torch.loader import QUANT_KEY, checkpoint_precision, load_model, read_config, read_tensors


@pytest.fixture(scope="module")
def int8_dir(tiny_draft: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_quantized_checkpoint(tiny_draft, tmp_path_factory.mktemp("q") / "draft-int8").path


def test_every_matrix_is_int8_with_per_row_float32_scales(tiny_draft: Path, int8_dir: Path) -> None:
    src = read_tensors(tiny_draft)
    out = load_file(str(int8_dir / "model.safetensors"))
    matrices = [n for n, t in src.items() if t.dim() == 2]
    assert matrices  # embedding, attention and MLP projections, LM head
    for name in matrices:
        q, scale = out[name], out[name + "_scale"]
        assert q.dtype == torch.int8 and q.shape == src[name].shape
        assert scale.dtype == torch.float32 and scale.shape == (src[name].shape[0],)
        ref_q, ref_scale = quantize_int8(src[name])
        assert torch.equal(q, ref_q) and torch.equal(scale, ref_scale)
        # symmetric, per output channel: each row's largest weight maps to +-127
        assert int(q.abs().amax(dim=1).min()) == 127
    for name, t in src.items():
        if t.dim() == 1:  # norms stay float
            assert out[name].dtype == torch.float32 and torch.equal(out[name], t.float())


def test_config_and_tokenizer_travel_with_the_weights(tiny_draft: Path, int8_dir: Path) -> None:
    cfg = read_config(int8_dir)
    assert cfg[QUANT_KEY]["method"] == "int8_weight_only"
    assert cfg[QUANT_KEY]["granularity"] == "per_output_channel" and cfg[QUANT_KEY]["symmetric"] is True
    assert {k: v for k, v in cfg.items() if k != QUANT_KEY} == read_config(tiny_draft)
    assert (int8_dir / "tokenizer.json").read_bytes() == (tiny_draft / "tokenizer.json").read_bytes()
    assert sorted(p.name for p in int8_dir.glob("*.safetensors")) == ["model.safetensors"]


def test_loader_runs_the_artefact_as_int8(tiny_draft: Path, int8_dir: Path) -> None:
    m = load_model(int8_dir)  # precision auto
    assert m.precision == "int8"
    in_memory = load_model(tiny_draft, "int8", device="cpu")  # the same scheme, quantized on load
    assert m.weight_bytes == in_memory.weight_bytes
    ids = [1, 5, 9, 30, 7]
    a = m.lm.new_session().forward(ids, len(ids))
    b = in_memory.lm.new_session().forward(ids, len(ids))
    assert torch.equal(a, b)


def bare_copy(checkpoint: Path, dst: Path) -> tuple[Path, dict]:
    """A copy of ``checkpoint`` whose config says nothing of its quantization, and that config."""
    shutil.copytree(checkpoint, dst)
    cfg = read_config(dst)
    del cfg[QUANT_KEY]
    (dst / "config.json").write_text(json.dumps(cfg))
    return dst, cfg


def test_int8_tensors_alone_are_detected_as_int8(int8_dir: Path, tmp_path: Path) -> None:
    bare, cfg = bare_copy(int8_dir, tmp_path / "bare")
    assert checkpoint_precision(cfg) is None  # the config alone says nothing...
    assert checkpoint_precision(cfg, bare) == "int8"  # ...the int8 tensors do
    assert load_model(bare).precision == "int8"


def test_rewriting_gives_identical_bytes_and_requantizing_is_a_fixed_point(
    tiny_draft: Path, int8_dir: Path, tmp_path: Path
) -> None:
    again = write_quantized_checkpoint(tiny_draft, tmp_path / "again").path
    for f in sorted(p.name for p in int8_dir.iterdir()):
        assert sha256_file(again / f) == sha256_file(int8_dir / f), f
    twice = write_quantized_checkpoint(int8_dir, tmp_path / "twice").path  # an int8 source is kept as it is
    assert sha256_file(twice / "model.safetensors") == sha256_file(int8_dir / "model.safetensors")


@pytest.fixture(scope="module")
def int4_dir(tiny_draft: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_quantized_checkpoint(tiny_draft, tmp_path_factory.mktemp("q") / "draft-int4", "int4").path


def test_int4_stores_the_layers_codes_two_a_byte_and_the_rest_as_int8(
    tiny_draft: Path, int4_dir: Path, int8_dir: Path
) -> None:
    src = read_tensors(tiny_draft)
    out = load_file(str(int4_dir / "model.safetensors"))
    layer_matrices = [n for n, t in src.items() if t.dim() == 2 and n.startswith(llama.LAYERS)]
    assert layer_matrices
    for name in layer_matrices:
        rows, cols = src[name].shape
        q, scale, zero = quantize_int4(src[name])
        assert out[name].dtype == torch.uint8 and out[name].shape == (rows, cols // 2)
        assert torch.equal(unpack_int4_codes(out[name]), q)
        assert out[name + "_scale"].dtype == torch.bfloat16 and out[name + "_scale"].shape == (rows, cols // INT4_GROUP)
        assert torch.equal(out[name + "_scale"], scale.bfloat16()) and torch.equal(out[name + "_zero"], zero.bfloat16())
    embedding = out[llama.EMBEDDING]
    assert embedding.dtype == torch.int8 and llama.EMBEDDING + "_zero" not in out
    cfg = read_config(int4_dir)
    assert cfg[QUANT_KEY]["method"] == "int4_weight_only"
    stored = sum(f.stat().st_size for f in int4_dir.glob("*.safetensors"))
    assert stored < 0.8 * sum(f.stat().st_size for f in int8_dir.glob("*.safetensors"))


def test_the_int4_checkpoint_runs_as_quantizing_at_load_does(tiny_draft: Path, int4_dir: Path) -> None:
    stored = load_model(int4_dir)  # precision auto: int4 on the CPU
    assert stored.precision == "int4"
    at_load = load_model(tiny_draft, "int4", device="cpu")
    for a, b in zip(stored.lm.weights.layers, at_load.lm.weights.layers, strict=True):
        assert isinstance(a.w_qkv, Int4Weight)
        assert torch.equal(a.w_qkv.packed, b.w_qkv.packed) and torch.equal(a.w_qkv.scale_zeros, b.w_qkv.scale_zeros)
    assert stored.weight_bytes == at_load.weight_bytes
    ids = [1, 5, 9, 30, 7]
    assert torch.equal(stored.lm.new_session().forward(ids, len(ids)), at_load.lm.new_session().forward(ids, len(ids)))
    # elsewhere than the CPU an int4 checkpoint runs as int8; in float it is dequantized
    assert checkpoint_precision(read_config(int4_dir), int4_dir, "cuda") == "int8"
    fp = load_model(int4_dir, "fp32")
    assert fp.lm.new_session().forward(ids, len(ids)).argmax(-1).tolist() == \
        stored.lm.new_session().forward(ids, len(ids)).argmax(-1).tolist()


def test_int4_is_detected_by_its_tensors_and_rewriting_it_changes_nothing(int4_dir: Path, tmp_path: Path) -> None:
    bare, cfg = bare_copy(int4_dir, tmp_path / "bare")
    assert checkpoint_precision(cfg, bare) == "int4"
    again = write_quantized_checkpoint(int4_dir, tmp_path / "again", "int4").path  # an int4 source is kept as it is
    assert sha256_file(again / "model.safetensors") == sha256_file(int4_dir / "model.safetensors")
    as_int8 = write_quantized_checkpoint(int4_dir, tmp_path / "int8", "int8").path  # dequantized, then int8
    assert load_model(as_int8).precision == "int8"


def test_int4_refuses_a_matrix_its_kernel_cannot_take(tiny_draft: Path, tmp_path: Path) -> None:
    from safetensors.torch import save_file

    odd = tmp_path / "odd"
    shutil.copytree(tiny_draft, odd)
    tensors = read_tensors(odd)
    name = f"{llama.LAYERS}0.mlp.down_proj.weight"
    tensors[name] = tensors[name][:, :-8].contiguous()  # inputs no longer a multiple of 32
    save_file(tensors, str(odd / "model.safetensors"))
    with pytest.raises(BuildError, match=rf"--draft-quant int4: int4 needs .*; {name} is \[\d+, \d+\] \(use int8\)"):
        write_quantized_checkpoint(odd, tmp_path / "out", "int4")
    assert not (tmp_path / "out").exists()


def test_refuses_architectures_the_int8_runtime_cannot_run(tiny_draft: Path, tmp_path: Path) -> None:
    other = tmp_path / "gpt2ish"
    shutil.copytree(tiny_draft, other)
    cfg = read_config(other)
    cfg["architectures"] = ["GPT2LMHeadModel"]
    (other / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(BuildError, match="--draft-quant none"):
        write_quantized_checkpoint(other, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_self_draft_is_fully_accepted_in_float_and_int8_shrinks_it(tiny_target: Path) -> None:
    # The target drafting for itself: in float every greedy draft token is the target's own.
    probe = ProbeSettings(num_prompts=2, max_new_tokens=10, k=3)
    r = measure_quantization(tiny_target, tiny_target, None, probe)
    assert r.precision_before == "fp32" and r.precision_after == "int8"
    assert r.acceptance_before is not None and r.acceptance_after is not None
    assert r.acceptance_before.drafted_tokens > 0
    assert r.acceptance_before.acceptance_rate == 1.0
    assert 0.0 <= r.acceptance_after.acceptance_rate <= 1.0
    # fp32 -> 1 byte per weight + a 2-byte scale per row: a bit over a quarter
    assert 0.25 < r.weight_ratio < 0.3
    assert r.acceptance_before.emitted_tokens <= 2 * 10


def test_probe_can_be_skipped(tiny_target: Path, tiny_draft: Path) -> None:
    r = measure_quantization(tiny_target, tiny_draft, None, ProbeSettings(num_prompts=0))
    assert r.acceptance_before is None and r.acceptance_after is None
    assert r.weight_bytes_after < r.weight_bytes_before


def test_probe_prompts(tmp_path: Path) -> None:
    packaged = load_probe_prompts()
    assert len(packaged) >= 4 and len(set(packaged)) == len(packaged)
    mine = tmp_path / "p.json"
    mine.write_text(json.dumps(["one", "two"]))
    assert load_probe_prompts(mine) == ["one", "two"]
    mine.write_text(json.dumps({"prompts": []}))
    with pytest.raises(BuildError, match="non-empty list"):
        load_probe_prompts(mine)
    with pytest.raises(BuildError, match="cannot read"):
        load_probe_prompts(tmp_path / "missing.json")

