"""`trtspec generate --local` and `trtspec models` through the real Typer app."""

from __future__ import annotations

import json
import re

import pytest
from typer.testing import CliRunner

from trtspec.cli.main import app
from trtspec.runtime.pair import load_pair
from trtspec.decoding import FixedDraftLength, GenerationRequest, Penalties, SamplingParams, StopCriteria
from trtspec.testing.tiny import EOS_PROMPTS

runner = CliRunner()


def test_generate_json_matches_the_target_alone(tiny_target, tiny_draft):
    args = ["generate", "--local", "--target", str(tiny_target), "--draft", str(tiny_draft),
            "--prompt", "The quick brown fox", "--max-tokens", "16", "--k", "3", "--json"]
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert set(out) >= {"text", "token_ids", "stats", "finish_reason"}
    assert len(out["token_ids"]) == 16 and out["finish_reason"] == "length"
    assert out["stats"]["drafted_tokens"] > 0 and out["k"] == 3
    pair = load_pair(tiny_target, None)
    ids = pair.target.tokenizer.encode_prompt("The quick brown fox")
    ref = pair.decoder().generate(GenerationRequest(tuple(ids), StopCriteria(16)), FixedDraftLength(0))
    assert out["token_ids"] == ref.token_ids
    assert out["text"] == ref.text


def test_generate_holds_back_eos_ignores_it_and_avoids_bad_words(tiny_target, tiny_draft):
    def generate(prompt: str, *extra: str) -> dict:
        args = ["generate", "--local", "--target", str(tiny_target), "--draft", str(tiny_draft), "--prompt", prompt,
                "--max-tokens", "30", "--k", "3", "--json", *extra]
        res = runner.invoke(app, args)
        assert res.exit_code == 0, res.output
        return json.loads(res.stdout)

    prompt = next((p for p in EOS_PROMPTS if generate(p)["finish_reason"] == "stop"), None)
    assert prompt is not None  # the precondition: an answer that EOS ends
    plain = generate(prompt)["token_ids"]
    eos = plain[-1]
    held = generate(prompt, "--min-tokens", "20")["token_ids"]
    assert len(held) >= 20 and eos not in held[:20] and held[: len(plain) - 1] == plain[:-1]
    ignored = generate(prompt, "--ignore-eos")
    assert ignored["finish_reason"] == "length" and ignored["token_ids"][: len(plain)] == plain
    tok = load_pair(tiny_target, None).target.tokenizer
    word, banned = next((w, t) for t in plain[:-1] if (w := tok.decode([t])).strip() and tok.encode_words([w]) == ((t,),))
    avoided = generate(prompt, "--bad-word", word)["token_ids"]
    assert banned not in avoided and avoided != plain


def test_generate_penalties_are_the_target_alones_under_the_same_penalties(tiny_target, tiny_draft):
    args = ["generate", "--local", "--target", str(tiny_target), "--draft", str(tiny_draft), "--prompt", "Numbers 0 1 2",
            "--max-tokens", "24", "--k", "3", "--json"]
    res = runner.invoke(app, args + ["--repetition-penalty", "1.8", "--presence-penalty", "0.5",
                                     "--frequency-penalty", "0.25"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    pair = load_pair(tiny_target, None)
    ids = tuple(pair.target.tokenizer.encode_prompt("Numbers 0 1 2"))
    pen = Penalties(repetition=1.8, presence=0.5, frequency=0.25)
    ref = pair.decoder().generate(GenerationRequest(ids, StopCriteria(24), SamplingParams(penalties=pen)),
                                  FixedDraftLength(0))
    plain = pair.decoder().generate(GenerationRequest(ids, StopCriteria(24)), FixedDraftLength(0))
    assert out["token_ids"] == ref.token_ids != plain.token_ids and out["stats"]["drafted_tokens"] > 0


def test_generate_logprobs_are_the_target_alones_speculating(tiny_target, tiny_draft):
    args = ["generate", "--local", "--target", str(tiny_target), "--draft", str(tiny_draft), "--prompt", "Numbers 0 1 2",
            "--max-tokens", "20", "--k", "3", "--logprobs"]
    out = json.loads(runner.invoke(app, args + ["--json", "--top-logprobs", "3"]).stdout)
    pair = load_pair(tiny_target, None)
    ids = tuple(pair.target.tokenizer.encode_prompt("Numbers 0 1 2"))
    ref = pair.decoder().generate(GenerationRequest(ids, StopCriteria(20), logprobs=True, top_logprobs=3),
                                  FixedDraftLength(0))
    assert out["token_ids"] == ref.token_ids and out["stats"]["drafted_tokens"] > 0
    assert out["logprobs"] == pytest.approx(ref.logprobs, abs=1e-4)
    assert [[i for i, _ in top] for top in out["top_logprobs"]] == [[i for i, _ in top] for top in ref.top_logprobs]
    bad = runner.invoke(app, args + ["--top-logprobs", "21"])
    assert bad.exit_code == 1 and bad.stderr.endswith("\nerror: top_logprobs must be an integer in [0, 20], got 21\n")
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    assert float(re.search(r"logprob sum (-?[0-9.]+) \(mean", res.stderr).group(1)) == pytest.approx(sum(ref.logprobs), abs=2e-3)
    assert "logprobs" not in json.loads(runner.invoke(app, args[:-1] + ["--json"]).stdout)


def test_generate_logit_bias_is_the_target_alones_under_the_same_bias(tiny_target, tiny_draft):
    from trtspec.decoding import LogitBias

    args = ["generate", "--local", "--target", str(tiny_target), "--draft", str(tiny_draft), "--prompt", "Numbers 0 1 2",
            "--max-tokens", "20", "--k", "3", "--json"]
    plain = json.loads(runner.invoke(app, args).stdout)["token_ids"]
    out = json.loads(runner.invoke(app, args + ["--logit-bias", f"{plain[2]}=-50", "--logit-bias", "5=2.5"]).stdout)
    pair = load_pair(tiny_target, None)
    ids = tuple(pair.target.tokenizer.encode_prompt("Numbers 0 1 2"))
    bias = LogitBias.of([(plain[2], -50.0), (5, 2.5)])
    ref = pair.decoder().generate(GenerationRequest(ids, StopCriteria(20), SamplingParams(logit_bias=bias)),
                                  FixedDraftLength(0))
    assert out["token_ids"] == ref.token_ids != plain and plain[2] not in ref.token_ids
    bad = runner.invoke(app, args + ["--logit-bias", "5:2"])
    assert bad.exit_code == 1 and bad.stderr == "error: --logit-bias takes ID=VALUE (a token id and a number), got '5:2'\n"


def test_generate_with_a_free_drafter_needs_no_draft_model(tiny_target):
    prompt = "one two three four one two three four one two"
    args = ["generate", "--local", "--target", str(tiny_target), "--drafter", "ngram",
            "--prompt", prompt, "--max-tokens", "16", "--k", "4", "--json"]
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["drafter"] == "ngram" and out["models"]["draft"] is None
    assert set(out["stats"]["drafted_by"]) <= {"ngram"}  # (a random tiny model seldom repeats itself)
    pair = load_pair(tiny_target, None)
    ids = pair.target.tokenizer.encode_prompt(prompt)
    ref = pair.decoder().generate(GenerationRequest(tuple(ids), StopCriteria(16)), FixedDraftLength(0))
    assert out["token_ids"] == ref.token_ids


def test_generate_streams_text_to_stdout(tiny_target):
    res = runner.invoke(app, ["generate", "--local", "--target", str(tiny_target), "--speculation", "off",
                              "--prompt", "Hello world", "--max-tokens", "8"])
    assert res.exit_code == 0, res.output
    pair = load_pair(tiny_target, None)
    ids = pair.target.tokenizer.encode_prompt("Hello world")
    ref = pair.decoder().generate(GenerationRequest(tuple(ids), StopCriteria(8)))
    assert res.stdout == ref.text + "\n"


def test_generate_sampling_is_reproducible_with_a_seed(tiny_target, tiny_draft):
    args = ["generate", "--local", "--target", str(tiny_target), "--draft", str(tiny_draft), "--prompt", "Hello",
            "--max-tokens", "12", "--temperature", "0.9", "--top-p", "0.95", "--top-k", "50", "--seed", "7", "--json"]
    a = json.loads(runner.invoke(app, args).stdout)
    b = json.loads(runner.invoke(app, args).stdout)
    assert a["token_ids"] == b["token_ids"]


def _error_line(res) -> str:
    return res.output.strip().splitlines()[-1]


def test_bad_inputs_give_one_line_errors(tiny_target, tiny_draft, tmp_path):
    base = ["generate", "--local", "--target", str(tiny_target), "--draft", str(tiny_draft)]
    cases = [
        (base + ["--prompt", "hi", "--max-tokens", "0"], "max_tokens must be > 0"),
        (base + ["--prompt", "", "--max-tokens", "4"], "prompt is empty"),
        (base + ["--prompt", "hi", "--k", "-1"], "--k must be >= 0"),
        (base + ["--prompt", "hi", "--temperature", "-1"], "temperature must be >= 0"),
        (base + ["--prompt", "hi", "--repetition-penalty", "0"], "repetition_penalty must be > 0, got 0.0"),
        (["generate", "--local", "--target", str(tmp_path / "missing"), "--prompt", "hi", "--speculation", "off"],
         "checkpoint not found"),
        (["generate", "--local", "--target", str(tiny_target), "--prompt", "hi"], "--draft is required"),
    ]
    for args, msg in cases:
        res = runner.invoke(app, args)
        assert res.exit_code != 0, args
        assert msg in _error_line(res), (args, res.output)
        assert "Traceback" not in res.output


def test_generate_exact_bf16_equals_the_target_alone(tiny_target, tiny_draft):
    def run(*extra: str) -> dict:
        args = ["generate", "--local", "--target", str(tiny_target), "--draft", str(tiny_draft), "--prompt",
                "Hello world", "--max-tokens", "24", "--target-precision", "bf16", "--exact", "--json", *extra]
        res = runner.invoke(app, args)
        assert res.exit_code == 0, res.output
        return json.loads(res.stdout)

    spec, alone = run("--k", "4"), run("--speculation", "off")
    assert spec["exact"] and spec["models"]["target"]["exact"] and spec["stats"]["drafted_tokens"] > 0
    assert spec["token_ids"] == alone["token_ids"]


def test_generate_exact_is_refused_against_a_server():
    res = runner.invoke(app, ["generate", "--url", "localhost:1", "--prompt", "x", "--exact"])
    assert res.exit_code != 0 and "--exact" in res.output
