"""The served models' parameters, typed once in ``trtspec.wire``: parsed by field type, rendered
by the writer and read back unchanged, unknown keys and bad values refused in one line, and the
docs table generated from the same fields."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from trtspec.wire import LMParams, SpecDecodeParams

REQUIRED = {"tokenizer_dir": "/tok", "vocab_size": "384", "target_max_context": "256"}
DOCS = Path(__file__).resolve().parents[1] / "docs" / "serving.md"


def test_values_are_parsed_by_field_type_and_empty_ones_are_defaults():
    p = SpecDecodeParams.from_parameters(
        {**REQUIRED, "draft_model": "draft", "draft_max_context": "128", "warmup": "False",
         "trace_sample_rate": "0.5", "max_queue": "", "supervise": " yes "}, "spec_decode")
    assert (p.vocab_size, p.draft_max_context, p.warmup, p.trace_sample_rate) == (384, 128, False, 0.5)
    assert p.max_queue == SpecDecodeParams.max_queue and p.supervise is True
    assert p.max_tokens_limit == 1024 and p.draft_length == 5  # the defaults, written in wire.py only


def test_what_the_writer_renders_the_reader_reads_back():
    p = SpecDecodeParams(tokenizer_dir="/t", vocab_size=9, target_max_context=64, draft_model="draft",
                         draft_max_context=32, apply_chat_template=False, draft_timeout_s=0.25)
    rendered = p.to_parameters()
    assert rendered["apply_chat_template"] == "false" and rendered["draft_timeout_s"] == "0.25"
    assert SpecDecodeParams.from_parameters(rendered, "spec_decode") == p
    lm = LMParams(checkpoint="/ckpt", max_sessions=3, fault_wrong_share=0.5)
    assert LMParams.from_parameters(lm.to_parameters(), "draft") == lm


@pytest.mark.parametrize("params, message", [
    ({"vocab_size": "384"}, "model 'sd': parameter(s) tokenizer_dir, target_max_context required in config.pbtxt"),
    ({**REQUIRED, "max_tokens_limt": "5"}, "model 'sd': unknown parameter(s) max_tokens_limt; allowed: tokenizer_dir,"),
    ({**REQUIRED, "max_queue": "many"}, "model parameter 'max_queue' must be an integer, got 'many'"),
    ({**REQUIRED, "trace_sample_rate": "nan"}, "model parameter 'trace_sample_rate' must be finite, got 'nan'"),
    ({**REQUIRED, "warmup": "maybe"}, "model parameter 'warmup' must be true or false, got 'maybe'"),
    ({**REQUIRED, "manifest_check": "some"}, "sd: manifest_check must be one of full, quick, off, got 'some'"),
    ({**REQUIRED, "draft_model": "draft"}, "sd: draft_max_context is required with a draft_model"),
    ({**REQUIRED, "max_concurrency": "0"}, "draft_length >= 0, max_concurrency >= 1, max_tokens_limit >= 1 required"),
])
def test_bad_parameters_are_refused_in_one_line(params, message):
    with pytest.raises(ValueError) as e:
        SpecDecodeParams.from_parameters(params, "sd")
    assert message in str(e.value) and "\n" not in str(e.value)


def test_lm_faults_are_checked_and_refused_on_the_target():
    with pytest.raises(ValueError, match=r"parameter 'fault_fail_share' must be in \[0, 1\], got 1.5"):
        LMParams.from_parameters({"checkpoint": "/c", "fault_fail_share": "1.5"}, "draft")
    for fault in ("fault_wrong_share", "fault_fail_share"):
        with pytest.raises(ValueError, match="wrong tokens and failures are injected into the draft only"):
            LMParams.from_parameters({"checkpoint": "/c", fault: "0.1"}, "target")
    assert LMParams.from_parameters({"checkpoint": "/c", "fault_delay_s": "0.1"}, "draft").has_faults
    assert LMParams.from_parameters({"checkpoint": "/c", "fault_delay_s": "0.1"}, "target").has_faults  # a slow target
    assert not LMParams(checkpoint="/c").has_faults


def test_the_text_limit_follows_the_context_unless_set():
    p = SpecDecodeParams.from_parameters({**REQUIRED, "target_max_context": "8192"}, "sd")
    assert p.text_limit_bytes == 32 * 8192 and replace(p, max_text_bytes=100).text_limit_bytes == 100
    assert SpecDecodeParams.from_parameters(REQUIRED, "sd").text_limit_bytes == 64 * 1024


def test_the_docs_tables_are_generated_from_the_fields():
    text = DOCS.read_text()
    for cls in (SpecDecodeParams, LMParams):
        table = cls.docs_table()
        assert table in text, f"docs/serving.md: paste {cls.__name__}.docs_table() (it changed)"
        assert table.count("\n") == len(cls.keys()) + 2
