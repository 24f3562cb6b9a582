"""The INT4 draft on the real demo weights: the GGUF's Q4_1 codes come back as they are, and greedy
speculation with it is the target's own output."""

from __future__ import annotations

import pytest
import torch

from trtspec.decoding import FixedDraftLength, GenerationRequest, StopCriteria
from trtspec.runtime.pair import load_pair
from trtspec.runtime.torch import llama
from trtspec.runtime.torch.loader import read_tensors

pytestmark = pytest.mark.slow


def test_int4_holds_the_demo_targets_q4_1_weights_as_they_are(demo_pair_paths):
    """The demo target is a Q4_1 GGUF dequantized: every layer matrix is on a grid of 32-weight groups,
    which quantize_int4 recovers (only float32 rounding left)."""
    matrices = {n: t for n, t in read_tensors(demo_pair_paths.target).items()
                if n.startswith(llama.LAYERS) and t.dim() == 2}
    assert len(matrices) == 30 * 7
    for name, w in matrices.items():
        q, scale, zero = llama.quantize_int4(w)
        back = ((q.view(w.shape[0], -1, llama.INT4_GROUP) - 8) * scale[..., None] + zero[..., None]).reshape(w.shape)
        assert float((back - w.float()).abs().max()) <= 1e-6 * float(w.abs().max()), name


def test_demo_pair_with_the_int4_draft_is_the_targets_greedy_output(demo_pair_paths):
    pair = load_pair(demo_pair_paths.target, demo_pair_paths.draft_at("int4"), draft_precision="int4")
    assert pair.draft.precision == "int4"
    tok, dec = pair.target.tokenizer, pair.decoder()
    drafted = accepted = 0
    for prompt in ("What is speculative decoding? Answer in one sentence.", "Name three primary colors."):
        req = GenerationRequest(tuple(tok.encode_prompt(prompt)), StopCriteria(24, eos_token_ids=tok.eos_token_ids()))
        out = dec.generate(req, FixedDraftLength(5))
        assert out.token_ids == dec.generate(req, FixedDraftLength(0)).token_ids, prompt
        drafted, accepted = drafted + out.stats.drafted_tokens, accepted + out.stats.accepted_tokens
    assert accepted / drafted > 0.5  # a draft that runs the target's own weights: most of its tokens hold


@pytest.mark.parametrize("capability, precision", [("AVX512", "int4"), ("DEFAULT", "int8")])
def test_generate_demo_drafts_at_int4_where_it_runs_well(demo_pair_paths, monkeypatch, capability, precision):
    """`trtspec generate --local --demo` picks the demo's draft as `trtspec demo` does: int4 where torch's
    int4 kernel is vectorized, the INT8 copy elsewhere."""
    import json

    from typer.testing import CliRunner

    from trtspec.cli.main import app

    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: capability)
    res = CliRunner().invoke(app, ["generate", "--local", "--demo", "-p", "Name three primary colors.", "-n", "8",
                                   "--json"])
    assert res.exit_code == 0, res.output
    draft = json.loads(res.stdout)["models"]["draft"]
    assert draft["precision"] == precision
    assert draft["path"] == str(demo_pair_paths.draft_at(precision))
