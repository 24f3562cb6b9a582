"""The whole loop on CUDA with graphs: exact, and the graphs really replayed. Skipped without CUDA.

Needs no conftest fixtures (it makes its own tiny checkpoints), so it also runs
as ``pytest --noconftest`` on a machine that has torch and transformers only.
"""

from __future__ import annotations

import random

import pytest
import torch

from trtspec.decoding import FixedDraftLength, GenerationRequest, SamplingParams, StopCriteria
from trtspec.runtime.pair import load_pair
from trtspec.testing.tiny import make_tiny_llama

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


@pytest.fixture(scope="module")
def cuda_pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny_gpu")
    target = make_tiny_llama(root / "target", seed=0)
    draft = make_tiny_llama(root / "draft", seed=1, base=target, noise=0.01)
    return load_pair(target, draft, target_precision="bf16", draft_precision="int8", device="cuda")


def test_cuda_defaults_are_exact_mode_with_graphs_captured_at_load(cuda_pair):
    assert cuda_pair.target.exact and not cuda_pair.draft.exact
    for m in (cuda_pair.target, cuda_pair.draft):
        assert m.graphs is not None and m.graphs.graphs >= 1 and m.graphs.capture_s > 0


@pytest.mark.parametrize("k", [1, 3, 5, 7])
def test_graphed_speculation_equals_the_target_alone(cuda_pair, k):
    dec = cuda_pair.decoder()
    rng = random.Random(k)
    for _ in range(6):
        ids = tuple(rng.randrange(3, 380) for _ in range(rng.randrange(3, 30)))
        req = GenerationRequest(ids, StopCriteria(40))
        ref = dec.generate(req, FixedDraftLength(0))
        out = dec.generate(req, FixedDraftLength(k))
        assert out.token_ids == ref.token_ids
        assert out.stats.drafted_tokens > 0
        sp = SamplingParams(temperature=0.8, seed=k, exact=True)
        sreq = GenerationRequest(ids, StopCriteria(20), sampling=sp)
        assert dec.generate(sreq, FixedDraftLength(k)).token_ids == dec.generate(sreq, FixedDraftLength(0)).token_ids
    stats = cuda_pair.target.graphs
    assert stats is not None and stats.graphs <= 3  # one rows bucket; a few window buckets at most
