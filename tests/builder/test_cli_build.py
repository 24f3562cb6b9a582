"""`trtspec build` through a Typer app holding the command (the lead wires it into cli/main.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from trtspec.cli.build import build

app = typer.Typer()
app.command("build")(build)


@app.command("noop")
def _noop() -> None:
    """A second command, so that `build` is invoked by name as in the real app."""


runner = CliRunner()


def target_args(target: Path, root: Path) -> list[str]:
    return ["build", "--target", str(target), "--engines", str(root / "engines"),
            "--model-repo", str(root / "model_repo"), "--name", "tiny", "--probe-prompts", "2",
            "--probe-tokens", "8", "--max-sessions", "2"]


def base_args(target: Path, draft: Path, root: Path) -> list[str]:
    return target_args(target, root) + ["--draft", str(draft), "--draft-quant", "int8"]


def test_json_result(tiny_target: Path, tiny_draft: Path, tmp_path: Path) -> None:
    res = runner.invoke(app, base_args(tiny_target, tiny_draft, tmp_path) + ["--json"])
    assert res.exit_code == 0, res.output
    assert res.stderr == ""  # no progress display under --json
    out = json.loads(res.stdout)
    assert out["name"] == "tiny" and out["backend"] == "torch" and out["dry_run"] is False
    assert out["draft_model"] is True and out["default_drafter"] == "model"
    assert [s["name"] for s in out["steps"]] == ["check", "quantize", "compile", "memory", "manifest", "model_repo"]
    q = out["quantization"]
    assert q["precision_after"] == "int8" and q["weight_bytes_after"] < q["weight_bytes_before"]
    assert q["acceptance_before"]["drafted_tokens"] > 0 and q["probe"] == {"num_prompts": 2, "max_new_tokens": 8, "k": 5}
    assert out["memory_plan"]["sessions"] == 2
    assert out["manifest"]["name"] == "tiny"
    assert json.loads(Path(out["manifest_path"]).read_text()) == out["manifest"]
    assert (tmp_path / "model_repo" / "spec_decode" / "config.pbtxt").is_file()


def test_human_output_shows_progress_and_the_figures(tiny_target: Path, tiny_draft: Path, tmp_path: Path) -> None:
    res = runner.invoke(app, base_args(tiny_target, tiny_draft, tmp_path))
    assert res.exit_code == 0, res.output
    assert "Quantize the draft" in res.stderr and "Plan the memory pools" in res.stderr  # progress on stderr
    assert "draft INT8:" in res.stdout and "greedy acceptance" in res.stdout
    assert "memory plan:" in res.stdout and "target  weights" in res.stdout and "draft   weights" in res.stdout
    assert "drafting:    a draft model; requests that name no drafter draft with model" in res.stdout
    again = runner.invoke(app, base_args(tiny_target, tiny_draft, tmp_path))
    assert again.exit_code == 0 and "unchanged inputs: reused" in again.stdout


def test_trtllm_dry_run_prints_commands_and_configs(tiny_target: Path, tiny_draft: Path, tmp_path: Path) -> None:
    args = base_args(tiny_target, tiny_draft, tmp_path) + ["--backend", "trtllm", "--dry-run", "--device-memory",
                                                            "80GiB", "--probe-prompts", "0"]
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    assert res.stdout.count("trtllm-build --checkpoint_dir") == 2
    assert "--speculative_decoding_mode draft_tokens_external --max_draft_len 5" in res.stdout
    assert "target/config.pbtxt:" in res.stdout and 'key: "kv_cache_free_gpu_mem_fraction"' in res.stdout
    assert not (tmp_path / "engines").exists()
    out = json.loads(runner.invoke(app, args + ["--json"]).stdout)
    assert len(out["trtllm"]["commands"]) == 4 and set(out["trtllm"]["configs"]) == {"target", "draft"}


def error_line(res) -> str:
    return res.output.strip().splitlines()[-1]


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--demo"], "--demo and --target/--draft are mutually exclusive"),
        (["--device-memory", "lots"], "cannot read a size from 'lots'"),
        (["--max-draft-len", "0"], "--max-draft-len must be in [1, 64]"),
        (["--backend", "trtllm"], "TensorRT-LLM"),
        (["--device-memory", "1GiB"], "the models do not fit"),
    ],
)
def test_errors_are_one_line(tiny_target: Path, tiny_draft: Path, tmp_path: Path, extra: list[str], message: str) -> None:
    res = runner.invoke(app, base_args(tiny_target, tiny_draft, tmp_path) + extra)
    assert res.exit_code == 1, res.output
    assert message in error_line(res) and "Traceback" not in res.output


def test_the_target_is_required(tmp_path: Path) -> None:
    res = runner.invoke(app, ["build", "--engines", str(tmp_path)])
    assert res.exit_code == 1 and error_line(res) == "error: --target is required (or pass --demo)"


def test_an_output_directory_that_cannot_be_made_is_refused_before_the_steps(tiny_target: Path, tiny_draft: Path,
                                                                            tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    args = base_args(tiny_target, tiny_draft, tmp_path)
    args[args.index("--model-repo") + 1] = str(blocker / "model_repo")
    res = runner.invoke(app, args)
    assert res.exit_code == 1
    assert error_line(res) == f"error: --model-repo {blocker / 'model_repo'}: {blocker} is not a directory"
    assert not (tmp_path / "engines").exists()  # no step ran, nothing was created


def test_without_a_draft_the_target_is_served_with_ngram(tiny_target: Path, tmp_path: Path) -> None:
    res = runner.invoke(app, target_args(tiny_target, tmp_path) + ["--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["draft_model"] is False and out["default_drafter"] == "ngram" and out["quantization"] is None
    steps = {s["name"]: s for s in out["steps"]}
    assert steps["quantize"]["status"] == "skipped" and "no draft model" in steps["quantize"]["detail"]
    assert out["memory_plan"]["draft"] is None and list(out["manifest"]["models"]) == ["target"]
    assert sorted(p.name for p in (tmp_path / "model_repo").iterdir()) == ["spec_decode", "target"]


def test_without_a_draft_the_summary_says_what_drafts(tiny_target: Path, tmp_path: Path) -> None:
    res = runner.invoke(app, target_args(tiny_target, tmp_path) + ["--default-drafter", "suffix"])
    assert res.exit_code == 0, res.output
    assert "no draft model: nothing to quantize, no acceptance probe" in res.stderr  # the skipped step
    assert "drafting:    no draft model; requests that name no drafter draft with suffix" in res.stdout
    assert "target  weights" in res.stdout and "draft   weights" not in res.stdout
    assert 'key: "default_drafter" value: { string_value: "suffix" }' in (
        tmp_path / "model_repo" / "spec_decode" / "config.pbtxt").read_text()


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--default-drafter", "model"],
         "--default-drafter model needs a draft model: pass --draft, or choose ngram, suffix or auto"),
        (["--backend", "trtllm", "--dry-run"],
         "--backend trtllm needs --draft: a repository without a draft model is built for the torch backend only"),
    ],
)
def test_without_a_draft_refusals_are_one_line(tiny_target: Path, tmp_path: Path, extra: list[str], message: str) -> None:
    res = runner.invoke(app, target_args(tiny_target, tmp_path) + extra)
    assert res.exit_code == 1 and error_line(res) == f"error: {message}", res.output
    assert not (tmp_path / "engines").exists()


@pytest.mark.slow
@pytest.mark.parametrize("quant, weight_ratio_under, acceptance_over", [
    ("int8", 0.3, 0.7),
    ("int4", 0.15, 0.8),  # int4 layers, int8 embedding and head; the demo's Q4_1 weights held as they are
])
def test_demo_build(tmp_path: Path, quant: str, weight_ratio_under: float, acceptance_over: float) -> None:
    """The real pair: SmolLM2-135M-Instruct, its draft quantized by the build and served at that precision."""
    res = runner.invoke(app, ["build", "--demo", "--draft-quant", quant, "--engines", str(tmp_path / "engines"),
                              "--model-repo", str(tmp_path / "model_repo"), "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    q = out["quantization"]
    assert out["name"] == "demo" and q["precision_before"] == "fp32" and q["precision_after"] == quant
    assert q["weight_ratio"] < weight_ratio_under
    assert q["acceptance_before"]["acceptance_rate"] == 1.0  # the draft in float is the target itself
    assert q["acceptance_after"]["acceptance_rate"] > acceptance_over
    assert out["manifest"]["models"]["draft"]["precision"] == quant
    print(json.dumps({"quantization": q, "memory_plan": out["memory_plan"]}, indent=2))
