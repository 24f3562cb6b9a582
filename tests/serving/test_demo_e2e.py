"""The real demo pair (SmolLM2-135M-Instruct + its quantized copy) through a real tritonserver."""

from __future__ import annotations

import pytest

from trtspec.builder.repo import write_model_repo
from trtspec.serving.client import GenerateParams, generate_grpc, generate_http
from trtspec.serving.launcher import ServerError, TritonServer, find_tritonserver
from trtspec.decoding import FixedDraftLength, GenerationRequest, StopCriteria

pytestmark = pytest.mark.slow

PROMPT = "What is speculative decoding? Answer in one sentence."


def test_demo_pair_greedy_through_triton_equals_the_target_alone(demo_pair_paths, static_policy, tmp_path):
    from trtspec.runtime.pair import load_pair

    try:
        install = find_tritonserver()
    except ServerError as e:
        pytest.skip(str(e))
    repo = write_model_repo(tmp_path / "repo", target_checkpoint=demo_pair_paths.target,
                            draft_checkpoint=demo_pair_paths.draft, draft_length=4, max_tokens_limit=64,
                            policy_file=static_policy)  # a fixed k: acceptance measures the draft, not the controller
    target = load_pair(demo_pair_paths.target, None)
    tok = target.target.tokenizer
    request = GenerationRequest(tuple(tok.encode_prompt(PROMPT)), StopCriteria(max_new_tokens=24, eos_token_ids=tok.eos_token_ids()))
    ref = target.decoder().generate(request, FixedDraftLength(0))
    with TritonServer(repo, install=install, log_file=tmp_path / "tritonserver.log") as server:
        streamed = generate_grpc(server.endpoints.grpc, PROMPT, GenerateParams(max_tokens=24))
        whole = generate_http(server.endpoints.http, PROMPT, GenerateParams(max_tokens=24))
    for r in (streamed, whole):
        assert r.output_ids == ref.token_ids and r.text == ref.text
        assert r.num_draft_tokens > 0 and r.acceptance_rate is not None and r.acceptance_rate > 0.5


def test_trtspec_demo_serves_the_same_text_with_speculation_auto_and_off(demo_pair_paths, tmp_path):
    """The README's main job, `trtspec demo`: its default draft is the demo rule's (int4 where it runs well),
    and each prompt's answer with speculation auto is the one without."""
    import json

    from typer.testing import CliRunner

    from trtspec.cli.main import app
    from trtspec.runtime.torch.loader import resolve_device

    try:
        find_tritonserver()
    except ServerError as e:
        pytest.skip(str(e))
    res = CliRunner().invoke(app, ["demo", "--out", str(tmp_path), "--prompts", "2", "--max-tokens", "24", "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["build"]["manifest"]["build_options"]["draft_quant"] == demo_pair_paths.draft_precision("auto", resolve_device())
    runs = out["requests"]
    assert [r["speculation"] for r in runs] == ["off", "auto", "off", "auto"]
    for off, auto in zip(runs[::2], runs[1::2]):
        assert auto["output_ids"] == off["output_ids"] and len(off["output_ids"]) == 24
    assert len(out["speedups"]) == 2
    assert out["speedups"][0] == round(runs[1]["tokens_per_s"] / runs[0]["tokens_per_s"], 3)
