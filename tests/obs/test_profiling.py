"""--profile N: torch.profiler over N iterations of the real loop, written as a Chrome trace."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trtspec.obs.profiling import IterationProfiler
from trtspec.runtime.pair import ModelPair
from trtspec.decoding import FixedDraftLength, GenerationRequest, StopCriteria


def _request(pair: ModelPair, n: int) -> GenerationRequest:
    return GenerationRequest(tuple(pair.target.tokenizer.encode_prompt("The quick brown fox")), StopCriteria(max_new_tokens=n))


def _steps(trace: Path) -> list[str]:
    events = json.loads(trace.read_text())["traceEvents"]
    return sorted({e["name"] for e in events if str(e.get("name", "")).startswith("ProfilerStep#")})


def test_profiles_n_iterations(tiny_pair: ModelPair, tmp_path: Path) -> None:
    decoder = tiny_pair.decoder()
    plain = decoder.generate(_request(tiny_pair, 30), FixedDraftLength(3))
    assert plain.stats.iterations > 3
    out = tmp_path / "trace.json"
    with IterationProfiler(3, out) as prof:
        result = decoder.generate(_request(tiny_pair, 30), prof.wrap(FixedDraftLength(3)))
        assert prof.written == out  # written as soon as the 3rd iteration finished
    assert prof.iterations == 3
    assert result.token_ids == plain.token_ids  # profiling changes nothing
    assert len(_steps(out)) == 3
    events = json.loads(out.read_text())["traceEvents"]
    assert any("aten::" in str(e.get("name", "")) for e in events)  # the models' ops are in it


def test_writes_what_it_has_when_the_request_ends_first(tiny_pair: ModelPair, tmp_path: Path) -> None:
    out = tmp_path / "sub" / "trace.json"
    with IterationProfiler(1000, out) as prof:
        result = tiny_pair.decoder().generate(_request(tiny_pair, 4), prof.wrap(FixedDraftLength(0)))
    assert prof.iterations == result.stats.iterations == 4
    assert out.is_file() and len(_steps(out)) >= 3


def test_needs_a_positive_n(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="--profile"):
        IterationProfiler(0, tmp_path / "t.json")
