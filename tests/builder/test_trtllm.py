"""The TensorRT-LLM path everywhere: build arguments, generated configs, early failure without a GPU."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from trtspec.builder import trtllm
from trtspec.builder.errors import BuildError, TrtllmUnavailableError
from trtspec.builder.memory import GiB
from trtspec.builder.pipeline import run_build

HAS_TRTLLM = trtllm.trtllm_version() is not None


def specs(tmp: Path, draft_int8: bool = True) -> tuple[trtllm.EngineSpec, trtllm.EngineSpec]:
    return trtllm.engine_specs(
        target_dir=tmp / "hf-target", draft_dir=tmp / "hf-draft", target_arch="LlamaForCausalLM",
        draft_arch="LlamaForCausalLM", engine_root=tmp / "engines" / "x", work_dir=tmp / "engines" / "x" / "work",
        draft_int8=draft_int8, max_draft_len=5, max_context=4096, max_batch_size=8,
    )


def opt(cmd: list[str], flag: str) -> str:
    assert cmd.count(flag) == 1, f"{flag} once in {cmd}"
    return cmd[cmd.index(flag) + 1]


def test_target_engine_is_built_for_external_draft_tokens(tmp_path: Path) -> None:
    target, _ = specs(tmp_path)
    cmd = trtllm.build_command(target)
    assert cmd[0] == "trtllm-build"
    assert opt(cmd, "--speculative_decoding_mode") == "draft_tokens_external"
    assert opt(cmd, "--max_draft_len") == "5"
    assert opt(cmd, "--use_paged_context_fmha") == "enable"  # KV reuse needs it
    assert opt(cmd, "--kv_cache_type") == "paged"
    assert opt(cmd, "--max_batch_size") == "8"
    assert opt(cmd, "--max_seq_len") == "4096" and opt(cmd, "--max_input_len") == "4095"
    assert opt(cmd, "--checkpoint_dir") == str(tmp_path / "engines/x/work/target-ckpt")
    assert opt(cmd, "--output_dir") == str(tmp_path / "engines/x/target")
    assert "--gather_generation_logits" not in cmd


def test_draft_engine_is_plain_and_keeps_its_logits(tmp_path: Path) -> None:
    _, draft = specs(tmp_path)
    cmd = trtllm.build_command(draft)
    assert "--speculative_decoding_mode" not in cmd and "--max_draft_len" not in cmd
    assert "--gather_generation_logits" not in cmd  # spec_decode never asks the draft engine for logits
    assert opt(cmd, "--use_paged_context_fmha") == "enable"


def test_only_the_draft_is_quantized_w8a16(tmp_path: Path) -> None:
    target, draft = specs(tmp_path)
    t_cmd, d_cmd = trtllm.convert_command(target), trtllm.convert_command(draft)
    assert t_cmd[1:3] == ["-m", "trtspec.builder.trtllm_convert"]
    assert "--use_weight_only" not in t_cmd
    assert "--use_weight_only" in d_cmd and opt(d_cmd, "--weight_only_precision") == "int8"
    assert opt(d_cmd, "--model_dir") == str(tmp_path / "hf-draft") and opt(d_cmd, "--dtype") == "bfloat16"
    assert draft.precision == "w8a16" and target.precision == "bfloat16"
    _, plain = specs(tmp_path, draft_int8=False)
    assert "--use_weight_only" not in trtllm.convert_command(plain)


def test_the_converter_parses_the_arguments_it_is_given(tmp_path: Path) -> None:
    # Its command line is what build_engines runs; without tensorrt_llm it fails at the import, not the parse.
    _, draft = specs(tmp_path)
    proc = subprocess.run(trtllm.convert_command(draft), capture_output=True, text=True)
    if HAS_TRTLLM:
        pytest.skip("tensorrt_llm is installed: the converter would really run")
    assert proc.returncode != 0 and "No module named 'tensorrt_llm'" in proc.stderr
    bad = subprocess.run(trtllm.convert_command(draft) + ["--bogus"], capture_output=True, text=True)
    assert bad.returncode == 2 and "unrecognized arguments: --bogus" in bad.stderr


def test_a_draft_length_is_required(tmp_path: Path) -> None:
    with pytest.raises(BuildError, match="max-draft-len"):
        trtllm.engine_specs(
            target_dir=tmp_path, draft_dir=tmp_path, target_arch="A", draft_arch="A", engine_root=tmp_path,
            work_dir=tmp_path, draft_int8=True, max_draft_len=0, max_context=64, max_batch_size=1,
        )


def model_config(**overrides) -> trtllm.TrtllmModelConfig:
    base = dict(name="target", engine_dir=Path("/engines/demo/target"), max_batch_size=8, max_seq_len=4096,
                kv_cache_free_gpu_mem_fraction=0.4213, max_tokens_in_paged_kv_cache=32896)
    base.update(overrides)
    return trtllm.TrtllmModelConfig(**base)


def parse(text: str):
    pb2 = pytest.importorskip("tritonclient.grpc.model_config_pb2")
    from google.protobuf import text_format

    return text_format.Parse(text, pb2.ModelConfig())


def test_config_pbtxt_is_valid_and_filled_from_the_build() -> None:
    cfg = parse(trtllm.tensorrtllm_config_pbtxt(model_config()))
    assert cfg.name == "target" and cfg.backend == "tensorrtllm" and cfg.max_batch_size == 8
    assert cfg.model_transaction_policy.decoupled is False
    params = {k: v.string_value for k, v in cfg.parameters.items()}
    assert params["gpt_model_type"] == "inflight_fused_batching"
    assert params["gpt_model_path"] == "/engines/demo/target"
    assert params["kv_cache_free_gpu_mem_fraction"] == "0.42"
    assert params["max_tokens_in_paged_kv_cache"] == "32896"
    assert params["enable_kv_cache_reuse"] == "true"
    assert params["max_attention_window_size"] == "4096"
    assert params["max_beam_width"] == "1"
    inputs = {i.name: i for i in cfg.input}
    assert {"input_ids", "input_lengths", "request_output_len", "draft_input_ids", "end_id", "streaming"} <= set(inputs)
    assert inputs["draft_input_ids"].optional and inputs["draft_input_ids"].allow_ragged_batch
    assert not inputs["input_ids"].optional
    assert {"output_ids", "sequence_length", "generation_logits"} <= {o.name for o in cfg.output}


def test_decoupled_and_reuse_switches() -> None:
    cfg = parse(trtllm.tensorrtllm_config_pbtxt(model_config(name="draft", decoupled=True, enable_kv_cache_reuse=False)))
    assert cfg.name == "draft" and cfg.model_transaction_policy.decoupled is True
    assert cfg.parameters["enable_kv_cache_reuse"].string_value == "false"


def test_write_model_is_idempotent(tmp_path: Path) -> None:
    path = trtllm.write_trtllm_model(tmp_path, model_config())
    assert path == tmp_path / "target" / "config.pbtxt" and (tmp_path / "target" / "1").is_dir()
    mtime = path.stat().st_mtime_ns
    trtllm.write_trtllm_model(tmp_path, model_config())
    assert path.stat().st_mtime_ns == mtime


def test_build_engines_runs_convert_then_build_and_reports_failures(tmp_path: Path) -> None:
    # The GPU boundary: a runner standing in for the real tools, recording what it is asked to run.
    ran: list[list[str]] = []

    def runner(cmd):
        ran.append(list(cmd))
        fail = cmd[0] == "trtllm-build" and "--max_draft_len" not in cmd  # the draft's build fails
        return subprocess.CompletedProcess(cmd, 1 if fail else 0, "", "[TRT] out of memory\n" if fail else "")

    target, draft = specs(tmp_path)
    with pytest.raises(BuildError, match=r"building the draft engine failed \(trtllm-build exited 1\): \[TRT\] out of memory"):
        trtllm.build_engines([target, draft], lambda _m: None, runner)
    assert [c[0] for c in ran] == [trtllm.convert_command(target)[0], "trtllm-build"] * 2
    assert ran[1] == trtllm.build_command(target)


@pytest.mark.skipif(HAS_TRTLLM, reason="tensorrt_llm is installed here")
def test_without_tensorrt_llm_the_build_fails_early_with_a_clear_message(tiny_options, tmp_path: Path) -> None:
    with pytest.raises(TrtllmUnavailableError, match="TensorRT-LLM 1.2.x and an NVIDIA GPU.*--dry-run"):
        run_build(tiny_options(tmp_path, backend="trtllm"))
    assert not (tmp_path / "engines").exists() and not (tmp_path / "model_repo").exists()


def test_dry_run_prints_commands_and_configs_and_writes_nothing(
    tiny_options, tiny_target: Path, tiny_draft: Path, tmp_path: Path
) -> None:
    r = run_build(tiny_options(tmp_path, backend="trtllm", dry_run=True,
                               device_memory_bytes=80 * GiB))
    assert not (tmp_path / "engines").exists() and not (tmp_path / "model_repo").exists()
    assert [c[0] for c in r.trtllm_commands][1::2] == ["trtllm-build", "trtllm-build"]
    assert r.trtllm_commands[1] == trtllm.build_command(trtllm.engine_specs(
        target_dir=tiny_target, draft_dir=tiny_draft, target_arch="LlamaForCausalLM", draft_arch="LlamaForCausalLM",
        engine_root=tmp_path / "engines" / "tiny", work_dir=tmp_path / "engines" / "tiny" / "work", draft_int8=True,
        max_draft_len=5, max_context=256, max_batch_size=4)[0])
    plan = r.memory_plan
    assert plan.device.total_bytes == 80 * GiB and plan.target.kv_tokens % 32 == 0
    for role, share in (("target", plan.target), ("draft", plan.draft)):
        cfg = parse(r.trtllm_configs[role])
        assert cfg.parameters["max_tokens_in_paged_kv_cache"].string_value == str(share.max_tokens_in_paged_kv_cache)
        assert cfg.parameters["kv_cache_free_gpu_mem_fraction"].string_value == f"{share.kv_cache_free_gpu_mem_fraction:.2f}"
    assert r.manifest.models["draft"].precision == "w8a16" and r.manifest.backend == "trtllm"
    assert r.quantization is not None and r.quantization.precision_after == "int8"  # measured with the torch runtime
    assert [s.status for s in r.steps] == ["done", "done", "dry-run", "done", "dry-run", "dry-run"]


def test_dry_run_without_a_gpu_needs_the_device_size(tiny_options, tmp_path: Path) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is visible: its size is read")
    with pytest.raises(BuildError, match="--device-memory"):
        run_build(tiny_options(tmp_path, backend="trtllm", dry_run=True))


def test_a_trtllm_build_writes_a_spec_decode_that_serves_the_engines(
    tiny_options, tiny_target: Path, tiny_draft: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, reference
) -> None:
    """The whole build with the GPU boundary stood in for (TensorRT-LLM present; the engine tools
    write placeholder engines), then its spec_decode config loaded and served against emulated
    engines with the tensorrtllm interface."""
    import json

    from google.protobuf.json_format import MessageToDict

    from trtspec.serving.triton import spec_decode
    from trtspec.testing.fake_triton import FakeTriton, final_value, run_batch
    from trtspec.testing.fake_trtllm import TritonPythonModel, trtllm_model_configs

    def build_engines(specs, say):
        for spec in specs:
            spec.engine_dir.mkdir(parents=True, exist_ok=True)
            (spec.engine_dir / "config.json").write_text(json.dumps({"role": spec.role}))
            (spec.engine_dir / "rank0.engine").write_bytes(b"engine")

    monkeypatch.setattr(trtllm, "require_trtllm", lambda: "1.2.0")
    monkeypatch.setattr(trtllm, "build_engines", build_engines)
    r = run_build(tiny_options(tmp_path, backend="trtllm", device_memory_bytes=80 * GiB))
    repo = tmp_path / "model_repo"
    assert sorted(p.name for p in repo.iterdir()) == ["draft", "spec_decode", "target"]
    assert not (repo / "target" / "1" / "model.py").exists()  # the tensorrtllm backend runs the engine
    for role in ("target", "draft"):
        assert parse((repo / role / "config.pbtxt").read_text()).backend == "tensorrtllm"
    cfg = MessageToDict(parse((repo / "spec_decode" / "config.pbtxt").read_text()), preserving_proto_field_name=True)
    params = {k: v.get("string_value", "") for k, v in cfg["parameters"].items()}
    tok_dir = tmp_path / "engines" / "tiny" / "tokenizer"
    assert params["model_backend"] == "tensorrtllm" and params["draft_model"] == "draft"
    assert Path(params["tokenizer_dir"]) == tok_dir.resolve() and (tok_dir / "tokenizer.json").is_file()
    assert params["draft_length"] == "5" and params["target_max_context"] == "256"
    assert Path(params["manifest_file"]) == (r.engine_dir / "manifest.json").resolve()

    pb = FakeTriton()
    for name, config in trtllm_model_configs(tiny_target, tiny_draft).items():
        pb.add_model(name, TritonPythonModel(pb), config)
    cfg["parameters"]["warmup"] = {"string_value": "false"}
    pb.add_model("spec_decode", spec_decode.TritonPythonModel(pb), cfg)  # its manifest check passes: same build
    try:
        (call,) = run_batch(pb, [{"text_input": "The quick brown fox", "max_tokens": 24}])
        assert call.error is None, call.error
        assert list(final_value(call, "output_ids")) == reference("The quick brown fox", 24).token_ids
        assert final_value(call, "num_draft_tokens") > 0
    finally:
        pb.finalize()
