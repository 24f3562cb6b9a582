"""The real demo pair (SmolLM2-135M-Instruct + its INT8 copy) through a real tritonserver."""

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
