"""End to end on the TensorRT-LLM repository layout: a real tritonserver, real tritonclient calls.

``spec_decode`` is configured as ``trtspec build --backend trtllm`` configures it; ``target`` and
``draft`` carry the ``tensorrtllm`` model interface the build writes, answered by
:mod:`trtspec.testing.fake_trtllm` (Triton's Python backend: there is no GPU here). So Triton
itself checks every tensor ``spec_decode`` sends against that interface.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from trtspec.serving.client import (
    ClientError,
    GenerateParams,
    generate_grpc,
    generate_http,
)
from trtspec.serving.launcher import ServerError, TritonServer, find_tritonserver
from trtspec.testing.fake_trtllm import write_emulated_trtllm_repo

MAX_TOKENS_LIMIT = 200
PROMPTS = ("The quick brown fox", "Speculative decoding drafts tokens", "Hello world! How are you",
           "Numbers 0 1 2 3", "def f(x): return", "The cat sat on", "I am fine, thank", "with a small model")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, tiny_target: Path, tiny_draft: Path,
           static_policy: Path) -> Iterator[TritonServer]:
    try:
        install = find_tritonserver()
    except ServerError as e:
        pytest.skip(str(e))
    root = tmp_path_factory.mktemp("trtllm-e2e")
    repo = write_emulated_trtllm_repo(root / "model_repo", tiny_target, tiny_draft, max_tokens_limit=MAX_TOKENS_LIMIT,
                                      max_concurrency=8, policy_file=static_policy)
    with TritonServer(repo, log_file=root / "tritonserver.log", install=install) as s:
        yield s


def test_greedy_through_the_engines_equals_the_target_alone_over_grpc_and_http(server, reference):
    chunks: list[str] = []
    r = generate_grpc(server.endpoints.grpc, PROMPTS[0], GenerateParams(max_tokens=40), on_text=chunks.append)
    ref = reference(PROMPTS[0], 40)
    assert r.output_ids == ref.token_ids and r.text == ref.text == "".join(chunks)
    assert r.num_draft_tokens > 0 and r.num_accepted_tokens / r.num_draft_tokens > 0.5
    h = generate_http(server.endpoints.http, PROMPTS[1], GenerateParams(max_tokens=24))
    assert h.text == reference(PROMPTS[1], 24).text


def test_eight_concurrent_streams_and_a_bad_request_beside_them(server, reference):
    def one(i: int):
        return generate_grpc(server.endpoints.grpc, PROMPTS[i], GenerateParams(max_tokens=32))

    with ThreadPoolExecutor(9) as pool:
        futures = [pool.submit(one, i) for i in range(8)]
        bad = pool.submit(generate_grpc, server.endpoints.grpc, PROMPTS[0], GenerateParams(max_tokens=MAX_TOKENS_LIMIT + 1))
        results = [f.result(timeout=300) for f in futures]
        with pytest.raises(ClientError, match=f"max_tokens must be <= {MAX_TOKENS_LIMIT}"):
            bad.result(timeout=60)
    for i, r in enumerate(results):
        assert r.output_ids == reference(PROMPTS[i], 32).token_ids, i


def test_sampled_requests_repeat_under_a_seed(server):
    params = GenerateParams(max_tokens=20, temperature=0.8, top_k=40, seed=7)
    a = generate_grpc(server.endpoints.grpc, PROMPTS[2], params)
    b = generate_grpc(server.endpoints.grpc, PROMPTS[2], params)
    assert a.output_ids == b.output_ids and a.num_output_tokens == 20
