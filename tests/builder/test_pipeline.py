"""The whole build on the tiny pair: layout, contents, figures, idempotency, early failures."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import torch

from trtspec.builder.errors import BuildError, MemoryPlanError
from trtspec.builder.manifest import sha256_file, verify_engines
from trtspec.builder.memory import GiB
from trtspec.builder.pipeline import STEPS, BuildResult, StepEvent, run_build
from trtspec.builder.quantize import ProbeSettings
from trtspec.errors import IncompatibleModelsError, TrtspecError
from trtspec.runtime.torch.loader import checkpoint_precision, load_model, read_config


def snapshot(*roots: Path) -> dict[str, tuple[str, int]]:
    """Every file under ``roots``: (sha256, mtime_ns)."""
    return {
        str(p): (sha256_file(p), p.stat().st_mtime_ns)
        for root in roots for p in sorted(root.rglob("*")) if p.is_file()
    }


def model_config(repo: Path, model: str):
    """``repo/model/config.pbtxt``, parsed by Triton's own schema."""
    pb2 = pytest.importorskip("tritonclient.grpc.model_config_pb2")
    from google.protobuf import text_format

    return text_format.Parse((repo / model / "config.pbtxt").read_text(), pb2.ModelConfig())


def triton_config(repo: Path, model: str) -> dict:
    """The config in the JSON form Triton hands to a model's ``initialize``."""
    from google.protobuf import json_format

    return json_format.MessageToDict(model_config(repo, model), preserving_proto_field_name=True)


def repo_params(repo: Path, model: str) -> dict[str, str]:
    return {k: v.string_value for k, v in model_config(repo, model).parameters.items()}


def test_layout(tiny_build: BuildResult) -> None:
    e = tiny_build.engine_dir
    assert sorted(p.name for p in e.iterdir()) == ["draft", "manifest.json", "target"]
    for sub in ("target", "draft"):
        assert {"config.json", "model.safetensors", "tokenizer.json"} <= {p.name for p in (e / sub).iterdir()}
    repo = tiny_build.model_repo
    assert repo is not None
    for model in ("spec_decode", "target", "draft"):
        assert (repo / model / "config.pbtxt").is_file() and (repo / model / "1" / "model.py").is_file()
    assert [s.name for s in tiny_build.steps] == list(STEPS)
    assert all(s.status == "done" for s in tiny_build.steps) and not tiny_build.reused


def test_model_repo_is_filled_from_the_build(tiny_build: BuildResult) -> None:
    repo, e = tiny_build.model_repo, tiny_build.engine_dir.resolve()
    assert repo is not None
    draft, target, spec = (repo_params(repo, m) for m in ("draft", "target", "spec_decode"))
    assert draft["checkpoint"] == str(e / "draft") and draft["precision"] == "int8"
    assert target["checkpoint"] == str(e / "target") and target["precision"] == "fp32"
    assert draft["max_sessions"] == target["max_sessions"] == str(tiny_build.memory_plan.sessions) == "4"
    assert target["max_context"] == "256"
    assert spec["manifest_file"] == str(e / "manifest.json")
    assert spec["draft_length"] == "5"
    assert spec["draft_model"] == "draft" and spec["default_drafter"] == "model"
    assert tiny_build.has_draft and tiny_build.default_drafter == "model"


def test_int8_figures(tiny_build: BuildResult) -> None:
    q = tiny_build.quantization
    assert q is not None and q.precision_before == "fp32" and q.precision_after == "int8"
    assert 0.25 < q.weight_bytes_after / q.weight_bytes_before < 0.3
    for fig in (q.acceptance_before, q.acceptance_after):
        assert fig is not None and fig.prompts == 2 and fig.drafted_tokens > 0
        assert 0 <= fig.accepted_tokens <= fig.drafted_tokens
        assert fig.iterations <= fig.emitted_tokens <= 2 * 12
    # the figures describe the artefacts: the draft on disk holds exactly the bytes reported and planned
    on_disk = load_model(tiny_build.engine_dir / "draft")
    assert on_disk.precision == "int8" and on_disk.weight_bytes == q.weight_bytes_after
    assert tiny_build.memory_plan.draft.weight_bytes == q.weight_bytes_after
    assert tiny_build.manifest.quantization.report == q.to_dict()


def test_memory_plan_of_a_cpu_build(tiny_build: BuildResult) -> None:
    plan = tiny_build.memory_plan
    assert plan.device.kind == "cpu" and plan.device.source in ("/proc/meminfo", "psutil")
    assert plan.tokens_per_sequence == 256 + 5 and plan.sessions == 4
    assert plan.target.kv_bytes_per_token == 2 * 2 * 2 * 16 * 4  # 2 layers, 2 kv heads, head_dim 16, fp32
    assert plan.draft.kv_bytes_per_token == 2 * 2 * 2 * 16 * 4  # int8 weights, bf16 activations: on the CPU a fp32 cache
    assert tiny_build.manifest.memory_plan == plan.to_dict()


def test_rebuild_is_idempotent(tiny_options, tmp_path: Path) -> None:
    events: list[StepEvent] = []
    first = run_build(tiny_options(tmp_path), events.append)
    assert [e.step for e in events if e.status == "start"] == list(STEPS)
    before = snapshot(tmp_path / "engines", tmp_path / "model_repo")

    again = run_build(tiny_options(tmp_path))
    assert again.reused
    assert {s.name: s.status for s in again.steps}["quantize"] == "skipped"
    assert {s.name: s.status for s in again.steps}["compile"] == "skipped"
    assert snapshot(tmp_path / "engines", tmp_path / "model_repo") == before  # not one byte, not one mtime
    assert again.quantization == first.quantization  # the measured figures come back from the manifest
    assert again.manifest == first.manifest

    forced = run_build(tiny_options(tmp_path, force=True))
    assert not forced.reused
    after = snapshot(tmp_path / "engines", tmp_path / "model_repo")
    same_content = {p: sha for p, (sha, _) in before.items() if not p.endswith("manifest.json")}
    assert same_content == {p: sha for p, (sha, _) in after.items() if not p.endswith("manifest.json")}
    assert forced.manifest.created == first.manifest.created  # same inputs: same build


def test_changed_options_or_tampered_artefacts_rebuild(tiny_options, tmp_path: Path) -> None:
    no_probe = ProbeSettings(num_prompts=0)
    first = run_build(tiny_options(tmp_path, probe=no_probe))
    changed = run_build(tiny_options(tmp_path, probe=no_probe, max_draft_len=3))
    assert not changed.reused and changed.manifest.max_draft_len == 3
    assert changed.manifest.inputs_sha256 != first.manifest.inputs_sha256
    # a tampered artefact is rebuilt, not trusted
    tampered = tmp_path / "engines" / "tiny" / "target" / "generation_config.json"
    tampered.write_text("{}")
    healed = run_build(tiny_options(tmp_path, probe=no_probe, max_draft_len=3))
    assert not healed.reused and json.loads(tampered.read_text()) != {}


def test_int4_draft_is_written_and_served_at_int4(tiny_options, tiny_draft: Path, tmp_path: Path,
                                                  monkeypatch) -> None:
    r = run_build(tiny_options(tmp_path, draft_quant="int4"))
    q = r.quantization
    assert q is not None and q.precision_before == "fp32" and q.precision_after == "int4"
    assert q.acceptance_after is not None and q.acceptance_after.drafted_tokens > 0
    assert r.manifest.quantization.draft["method"] == "int4_weight_only"
    assert r.manifest.build_options["draft_quant"] == "int4" and r.manifest.models["draft"].precision == "int4"
    # the int4 checkpoint written, run at int4 by the server: what it holds is what was measured and planned
    written = r.engine_dir / "draft"
    assert checkpoint_precision(read_config(written), written) == "int4"
    assert (written / "model.safetensors").stat().st_size < 0.3 * (tiny_draft / "model.safetensors").stat().st_size
    assert repo_params(r.model_repo, "draft")["precision"] == "int4"
    served = load_model(written, "int4")
    assert served.weight_bytes == q.weight_bytes_after == r.memory_plan.draft.weight_bytes
    monkeypatch.setattr("trtspec.builder.pipeline.resolve_device", lambda _device: "cuda")  # no GPU here
    with pytest.raises(BuildError, match="--draft-quant int4 runs on the CPU.*serves on cuda: use --draft-quant int8"):
        run_build(tiny_options(tmp_path / "gpu", draft_quant="int4", device_memory_bytes=80 * GiB))


@pytest.mark.parametrize("capability, chosen", [("AVX512", "int4"), ("AVX2", "int4"), ("DEFAULT", "int8")])
def test_auto_draft_quant_takes_int4_where_its_kernel_is_vectorized(
    tiny_options, tmp_path: Path, monkeypatch, capability: str, chosen: str
) -> None:
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: capability)
    r = run_build(tiny_options(tmp_path, draft_quant="auto"))
    assert r.manifest.build_options["draft_quant"] == chosen and r.manifest.models["draft"].precision == chosen
    assert r.quantization is not None and r.quantization.precision_after == chosen
    assert checkpoint_precision(read_config(r.engine_dir / "draft"), r.engine_dir / "draft") == chosen
    said = [n for n in r.notes if n.startswith("--draft-quant auto")]
    assert said == ([] if chosen == "int4" else
                    ["--draft-quant auto: int8, not int4 (this CPU's torch kernels are DEFAULT: int4 runs there "
                     "slower than int8)"])


def test_auto_draft_quant_is_int8_off_the_cpu(tiny_options, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr("trtspec.builder.pipeline.resolve_device", lambda _device: "cuda")  # no GPU here
    r = run_build(tiny_options(tmp_path, draft_quant="auto", dry_run=True, device_memory_bytes=80 * GiB))
    assert r.manifest.build_options["draft_quant"] == "int8"
    assert r.manifest.models["draft"].precision == "bf16"  # the torch runtime's int8 is the CPU's
    trtllm = run_build(tiny_options(tmp_path / "trt", draft_quant="auto", backend="trtllm", dry_run=True,
                                    device_memory_bytes=80 * GiB))
    assert trtllm.manifest.build_options["draft_quant"] == "int8" and trtllm.manifest.models["draft"].precision == "w8a16"


def test_draft_without_quantization(tiny_options, tiny_draft: Path, tmp_path: Path) -> None:
    r = run_build(tiny_options(tmp_path, draft_quant="none"))
    assert r.quantization is None and r.manifest.quantization.draft == {"method": "none"}
    assert {s.name: s.status for s in r.steps}["quantize"] == "skipped"
    assert r.manifest.models["draft"].precision == "fp32"
    assert sha256_file(r.engine_dir / "draft" / "model.safetensors") == sha256_file(tiny_draft / "model.safetensors")
    assert load_model(r.engine_dir / "draft").precision == "fp32"


def test_a_build_without_a_draft_serves_the_target_alone(tiny_target_build: BuildResult) -> None:
    r, repo = tiny_target_build, tiny_target_build.model_repo
    assert repo is not None
    assert sorted(p.name for p in r.engine_dir.iterdir()) == ["manifest.json", "target"]
    assert sorted(p.name for p in repo.iterdir()) == ["spec_decode", "target"]
    quantize = {s.name: s for s in r.steps}["quantize"]
    assert quantize.status == "skipped" and quantize.detail == "no draft model: nothing to quantize, no acceptance probe"
    assert r.quantization is None and not r.has_draft and r.default_drafter == "ngram"
    spec = repo_params(repo, "spec_decode")
    assert spec["default_drafter"] == "ngram" and spec["draft_model"] == "" and spec["draft_max_context"] == "0"
    assert spec["draft_length"] == "5"  # k of the free drafters
    m = r.manifest
    assert set(m.models) == {"target"} and m.quantization.draft is None and m.quantization.report is None
    assert m.build_options["draft_quant"] is None and m.build_options["default_drafter"] == "ngram"
    assert r.memory_plan.draft is None and m.memory_plan["draft"] is None
    assert r.memory_plan.tokens_per_sequence == 256 + 5
    assert verify_engines(r.engine_dir, "torch") == m  # the check spec_decode makes at load


def test_the_repository_without_a_draft_drafts_with_ngram_and_auto(tiny_target_build: BuildResult) -> None:
    """The built configs, loaded as Triton would load them (spec_decode checks the manifest at load)."""
    from trtspec.serving.triton import lm, spec_decode
    from trtspec.testing.fake_triton import FakeTriton, final_value, run_batch

    repo = tiny_target_build.model_repo
    assert repo is not None
    pb = FakeTriton()
    pb.add_model("target", lm.TritonPythonModel(pb), triton_config(repo, "target"))
    pb.add_model("spec_decode", spec_decode.TritonPythonModel(pb), triton_config(repo, "spec_decode"))
    ask = {"text_input": "The quick brown fox. The quick brown fox", "max_tokens": 120}
    try:
        (ngram,) = run_batch(pb, [ask])  # the deployment's default drafter: ngram
        (auto,) = run_batch(pb, [{**ask, "drafter": "auto"}])  # no draft model: auto's free drafter alone
        (alone,) = run_batch(pb, [{**ask, "speculation": "off"}])
        assert ngram.error is None and auto.error is None and alone.error is None
        assert final_value(ngram, "num_draft_tokens") > 0 and final_value(auto, "num_draft_tokens") > 0
        assert final_value(alone, "num_draft_tokens") == 0
        for call in (ngram, auto):
            assert list(final_value(call, "output_ids")) == list(final_value(alone, "output_ids"))
    finally:
        pb.finalize()


def test_dropping_the_draft_removes_its_artefacts(tiny_options, tmp_path: Path) -> None:
    no_probe = ProbeSettings(num_prompts=0)
    run_build(tiny_options(tmp_path, probe=no_probe))
    engines, repo = tmp_path / "engines" / "tiny", tmp_path / "model_repo"
    assert (engines / "draft").is_dir() and (repo / "draft").is_dir()
    alone = run_build(tiny_options(tmp_path, draft=None, probe=no_probe))
    assert not alone.reused and not (engines / "draft").exists() and not (repo / "draft").exists()
    assert not [f.path for f in alone.manifest.files if f.path.startswith("draft/")]
    assert run_build(tiny_options(tmp_path, draft=None, probe=no_probe)).reused


def test_default_drafter_is_written_and_model_needs_a_draft(tiny_options, tmp_path: Path) -> None:
    suffix = run_build(tiny_options(tmp_path, draft=None, default_drafter="suffix"))
    assert suffix.model_repo is not None and repo_params(suffix.model_repo, "spec_decode")["default_drafter"] == "suffix"
    assert suffix.default_drafter == suffix.manifest.build_options["default_drafter"] == "suffix"
    auto = run_build(tiny_options(tmp_path, draft=None, default_drafter="auto"))
    assert any("auto_free" in n for n in auto.notes)  # auto without a draft model: its free drafter alone
    for overrides, message in (
        (dict(default_drafter="model"),
         "--default-drafter model needs a draft model: pass --draft, or choose ngram, suffix or auto"),
        (dict(backend="trtllm", dry_run=True), "--backend trtllm needs --draft"),
        (dict(default_drafter="lookup"), "--default-drafter must be one of model, ngram, suffix, auto"),
    ):
        with pytest.raises(BuildError, match="^" + re.escape(message)):
            run_build(tiny_options(tmp_path / "refused", draft=None, **overrides))
    assert not (tmp_path / "refused").exists()


def test_incompatible_pair_is_refused_before_anything_is_written(
    tiny_options, tiny_draft: Path, tmp_path: Path
) -> None:
    other = tmp_path / "wider"
    shutil.copytree(tiny_draft, other)
    cfg = json.loads((other / "config.json").read_text())
    cfg["vocab_size"] = 400
    (other / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(IncompatibleModelsError, match="vocabulary size mismatch"):
        run_build(tiny_options(tmp_path, draft=other))
    assert not (tmp_path / "engines").exists() and not (tmp_path / "model_repo").exists()


def test_models_that_do_not_fit_fail_before_any_work(tiny_options, tmp_path: Path) -> None:
    events: list[StepEvent] = []
    with pytest.raises(MemoryPlanError, match=r"do not fit in cpu \(size given\) \(1.00 GiB\)"):
        run_build(tiny_options(tmp_path, device_memory_bytes=1 * GiB), events.append)
    assert {e.step for e in events} == {"check"}  # failed while checking: nothing quantized, nothing written
    assert not (tmp_path / "engines").exists()


def test_policy_file_is_checked(tiny_options, tmp_path: Path) -> None:
    with pytest.raises(BuildError, match="policy file not found"):
        run_build(tiny_options(tmp_path, policy_file=tmp_path / "missing.yaml"))
    bad = tmp_path / "policy.yaml"
    bad.write_text("breaker:\n  no_such_key: 1\n")
    with pytest.raises(TrtspecError, match="no_such_key"):
        run_build(tiny_options(tmp_path, policy_file=bad))
    assert not (tmp_path / "engines").exists()


def test_bad_options_are_refused(tiny_options, tmp_path: Path) -> None:
    for overrides, message in (
        (dict(max_draft_len=0), "max-draft-len"),
        (dict(name="../escape"), "--name"),
        (dict(max_sessions=0), "max-sessions"),
        (dict(max_context=1), "max-context"),
        (dict(draft_quant="int2"), "--draft-quant must be one of auto, int8, int4, none, got 'int2'"),
        (dict(draft_quant="int4", backend="trtllm"), "--draft-quant int4 is the torch runtime's"),
    ):
        with pytest.raises(BuildError, match=message):
            run_build(tiny_options(tmp_path, **overrides))
