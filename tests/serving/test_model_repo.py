"""trtspec.builder.repo: the model repository the server loads (proved loadable by the e2e tests)."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from trtspec.builder.repo import model_py, render_pbtxt, write_model_repo
from trtspec.errors import CheckpointError, IncompatibleModelsError


def params(config_pbtxt: Path) -> dict[str, str]:
    text = config_pbtxt.read_text()
    return dict(re.findall(r'parameters: \{ key: "([^"]+)" value: \{ string_value: "((?:[^"\\]|\\.)*)" \} \}', text))


def snapshot(repo: Path) -> dict[str, tuple[bytes, int]]:
    return {str(p.relative_to(repo)): (p.read_bytes(), p.stat().st_mtime_ns) for p in sorted(repo.rglob("*")) if p.is_file()}


def test_layout_shims_and_parameters(tmp_path, tiny_target, tiny_draft):
    repo = write_model_repo(tmp_path / "repo", target_checkpoint=tiny_target, draft_checkpoint=tiny_draft,
                            max_tokens_limit=77, draft_length=3, max_sessions=9)
    assert sorted(p.name for p in repo.iterdir()) == ["draft", "spec_decode", "target"]
    for name, module in (("spec_decode", "spec_decode"), ("target", "lm"), ("draft", "lm")):
        code = (repo / name / "1" / "model.py").read_text()
        imports = [line for line in code.splitlines() if line.startswith(("import", "from"))]
        assert imports == [f"from trtspec.serving.triton.{module} import TritonPythonModel  # noqa: F401"]
    sd = params(repo / "spec_decode" / "config.pbtxt")
    assert sd["draft_model"] == "draft" and sd["max_tokens_limit"] == "77" and sd["draft_length"] == "3"
    assert sd["vocab_size"] == "384" and sd["target_max_context"] == "256" and sd["tokenizer_dir"] == str(tiny_target.resolve())
    assert params(repo / "draft" / "config.pbtxt")["checkpoint"] == str(tiny_draft.resolve())
    assert params(repo / "target" / "config.pbtxt")["max_sessions"] == "9"
    text = (repo / "spec_decode" / "config.pbtxt").read_text()
    assert "decoupled: true" in text and "max_batch_size: 64" in text


def test_rewriting_is_idempotent(tmp_path, tiny_target, tiny_draft):
    kw = dict(target_checkpoint=tiny_target, draft_checkpoint=tiny_draft)
    repo = write_model_repo(tmp_path / "repo", **kw)
    before = snapshot(repo)
    write_model_repo(tmp_path / "repo", **kw)
    assert snapshot(repo) == before  # same bytes, files not even touched


def test_without_a_draft_the_repository_serves_ngram_speculation(tmp_path, tiny_target, tiny_draft):
    repo = write_model_repo(tmp_path / "repo", target_checkpoint=tiny_target, draft_checkpoint=tiny_draft)
    assert params(repo / "spec_decode" / "config.pbtxt")["default_drafter"] == "model"
    write_model_repo(tmp_path / "repo", target_checkpoint=tiny_target)  # the draft we wrote goes away
    assert sorted(p.name for p in repo.iterdir()) == ["spec_decode", "target"]
    sd = params(repo / "spec_decode" / "config.pbtxt")
    assert sd["draft_model"] == "" and sd["default_drafter"] == "ngram"


def test_a_draft_directory_we_did_not_write_is_left_alone(tmp_path, tiny_target):
    foreign = tmp_path / "repo" / "draft" / "1"
    foreign.mkdir(parents=True)
    (foreign / "model.py").write_text("# someone else's model\n")
    write_model_repo(tmp_path / "repo", target_checkpoint=tiny_target)
    assert (foreign / "model.py").read_text() == "# someone else's model\n"


def test_a_draft_with_another_vocabulary_is_refused(tmp_path, tiny_target, tiny_draft):
    other = tmp_path / "other_draft"
    shutil.copytree(tiny_draft, other)
    cfg = json.loads((other / "config.json").read_text())
    cfg["vocab_size"] = 500
    (other / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(IncompatibleModelsError, match="target has 384 entries, draft has 500"):
        write_model_repo(tmp_path / "repo", target_checkpoint=tiny_target, draft_checkpoint=other)


def test_missing_inputs_are_checkpoint_errors(tmp_path, tiny_target):
    with pytest.raises(CheckpointError, match="checkpoint not found"):
        write_model_repo(tmp_path / "repo", target_checkpoint=tmp_path / "nope")
    with pytest.raises(CheckpointError, match="policy_file not found"):
        write_model_repo(tmp_path / "repo", target_checkpoint=tiny_target, policy_file=tmp_path / "policy.yaml")


def test_pbtxt_strings_are_escaped():
    cfg = {"name": "m", "max_batch_size": 0, "parameters": {"p": {"string_value": 'a "quoted" \\ path\nx'}}}
    assert render_pbtxt(cfg) == (
        'name: "m"\nmax_batch_size: 0\n'
        'parameters: { key: "p" value: { string_value: "a \\"quoted\\" \\\\ path\\nx" } }\n'
    )
    assert "TritonPythonModel" in model_py("x.y")


def test_a_tensorrtllm_repo_has_spec_decode_only_and_drops_our_torch_models(tmp_path: Path, tiny_target: Path,
                                                                             tiny_draft: Path) -> None:
    repo = write_model_repo(tmp_path / "repo", target_checkpoint=tiny_target, draft_checkpoint=tiny_draft)
    assert (repo / "target" / "1" / "model.py").is_file() and (repo / "draft" / "1" / "model.py").is_file()
    (repo / "target" / "config.pbtxt").write_text('backend: "tensorrtllm"\n')  # as the TensorRT-LLM build writes it
    write_model_repo(repo, target_checkpoint=tiny_target, draft_checkpoint=tiny_draft, model_backend="tensorrtllm")
    assert not (repo / "target" / "1" / "model.py").exists() and not (repo / "draft" / "1" / "model.py").exists()
    assert (repo / "target" / "config.pbtxt").read_text() == 'backend: "tensorrtllm"\n'  # not ours to write
    text = (repo / "spec_decode" / "config.pbtxt").read_text()
    assert 'key: "model_backend" value: { string_value: "tensorrtllm" }' in text
    with pytest.raises(ValueError, match="model_backend must be python or tensorrtllm"):
        write_model_repo(repo, target_checkpoint=tiny_target, model_backend="vllm")


def test_spec_decode_can_be_served_under_another_name(tmp_path, tiny_target):
    from trtspec.builder.repo import served_model_name
    from trtspec.errors import CheckpointError

    repo = write_model_repo(tmp_path / "repo", target_checkpoint=tiny_target, model_name="tensorrt_llm_bls")
    assert 'name: "tensorrt_llm_bls"' in (repo / "tensorrt_llm_bls" / "config.pbtxt").read_text()
    assert served_model_name(repo) == "tensorrt_llm_bls" and served_model_name(tmp_path) is None
    for bad in ("target", "a/b", ""):
        with pytest.raises(CheckpointError, match="model name"):
            write_model_repo(tmp_path / "bad", target_checkpoint=tiny_target, model_name=bad)
