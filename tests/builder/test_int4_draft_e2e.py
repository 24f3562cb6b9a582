"""A build with ``--draft-quant int4`` served by a real tritonserver: the draft runs at int4, and greedy
speculative output is the target's own."""

from __future__ import annotations

import pytest

from trtspec.builder.pipeline import run_build
from trtspec.builder.quantize import ProbeSettings
from trtspec.serving.client import GenerateParams, generate_grpc
from trtspec.serving.launcher import ServerError, TritonServer, find_tritonserver

PROMPTS = ("The quick brown fox", "Numbers 0 1 2 3", "def f(x): return")


def test_an_int4_draft_build_serves_the_targets_greedy_output(tiny_options, static_policy, tmp_path) -> None:
    try:
        install = find_tritonserver()
    except ServerError as e:
        pytest.skip(str(e))
    build = run_build(tiny_options(tmp_path, draft_quant="int4", probe=ProbeSettings(num_prompts=0),
                                   policy_file=static_policy))  # a fixed k: every request drafts
    assert build.model_repo is not None
    log = tmp_path / "tritonserver.log"
    with TritonServer(build.model_repo, install=install, log_file=log) as server:
        for prompt in PROMPTS:
            on = generate_grpc(server.endpoints.grpc, prompt, GenerateParams(max_tokens=24, speculation="on"))
            off = generate_grpc(server.endpoints.grpc, prompt, GenerateParams(max_tokens=24, speculation="off"))
            assert on.output_ids == off.output_ids and on.text == off.text, prompt
            assert on.num_draft_tokens > 0 and off.num_draft_tokens == 0
    assert "trtspec draft: " in log.read_text() and "(lean, int4) loaded" in log.read_text()
