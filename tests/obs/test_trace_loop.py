"""Rejection traces from the real loop (tiny models), greedy and sampled.

Uses the tokens the loop reports behind each outcome (``IterationOutcome.drafted`` and
``.target_tokens``).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from trtspec.testing.faults import WrongTokenDraft
from trtspec.obs.recorder import SpecMetrics
from trtspec.obs.sinks import PrometheusClientSink
from trtspec.obs.trace import RejectionTracer, read_events, summarize
from trtspec.runtime.pair import ModelPair
from trtspec.decoding import FixedDraftLength, GenerationRequest, SamplingParams, SpeculativeDecoder, StopCriteria

@pytest.mark.parametrize("sampling", [SamplingParams(), SamplingParams(temperature=0.9, seed=3)], ids=["greedy", "sampled"])
def test_loop_rejections_are_traced(tiny_pair: ModelPair, tmp_path: Path, sampling: SamplingParams) -> None:
    assert tiny_pair.draft is not None
    tok = tiny_pair.target.tokenizer
    draft = WrongTokenDraft(tiny_pair.draft.lm, share=0.3, seed=1)  # rejections guaranteed
    decoder = SpeculativeDecoder(tiny_pair.target.lm, draft, detokenizer=tok)
    tracer = RejectionTracer(tmp_path / "r.jsonl", sample_rate=1.0, detokenizer=tok)
    sink = PrometheusClientSink()
    metrics = SpecMetrics(sink, tracer=tracer)
    for i, text in enumerate(["The quick brown fox", "Hello world! How are"]):
        req = GenerationRequest(tuple(tok.encode_prompt(text)), StopCriteria(max_new_tokens=40), sampling, f"r{i}")
        decoder.generate(req, metrics.wrap_policy(FixedDraftLength(4), req.request_id))
    events, bad = read_events([tracer.path])
    assert bad == 0 and len(events) == tracer.written == tracer.offered
    assert len(events) == sink.total("trtspec_rejections_total") > 0
    for e in events:
        n = e["accepted"]
        assert e["draft_tokens"][:n] == e["target_tokens"][:n]  # the accepted prefix agrees
        if sampling.greedy:
            assert len(e["target_tokens"]) == e["k"]
            assert e["draft_tokens"][n] != e["target_tokens"][n]  # greedy rejects exactly where they differ
        else:
            assert len(e["target_tokens"]) == n + 1  # up to the correction token
        assert len(e["draft_text"]) == e["k"]
    assert summarize([tracer.path]).events == len(events)
