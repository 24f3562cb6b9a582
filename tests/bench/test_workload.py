"""Workload: the A/B split, output lengths, Poisson arrivals, prompt files."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from trtspec.bench.workload import (
    ArmSplit, OutputLength, Prompt, Workload, WorkloadError, load_prompts, long_prompt_texts, poisson_arrivals,
)


def test_arm_split_is_exact_and_interleaved() -> None:
    split = ArmSplit.parse("auto,off")
    assert list(itertools.islice(split.sequence(), 6)) == ["auto", "off", "auto", "off", "auto", "off"]
    split = ArmSplit.parse("auto:3, off:1")
    assert split.shares() == {"auto": 0.75, "off": 0.25}
    seq = list(itertools.islice(split.sequence(), 400))
    # after every prefix, each arm is within one request of its share
    for n in range(1, len(seq) + 1):
        assert abs(seq[:n].count("off") - n * 0.25) <= 1
    assert "off,off" not in ",".join(seq)  # interleaved, not blocks


@pytest.mark.parametrize("bad", ["", "maybe", "auto,auto", "auto:0", "auto:x"])
def test_arm_split_errors(bad: str) -> None:
    with pytest.raises(WorkloadError):
        ArmSplit.parse(bad)


def test_output_length() -> None:
    assert (OutputLength.parse("64").lo, OutputLength.parse(64).hi) == (64, 64)
    ol = OutputLength.parse("8-16")
    import random

    rng = random.Random(0)
    draws = [ol.draw(rng) for _ in range(500)]
    assert min(draws) == 8 and max(draws) == 16
    for bad in ("0", "16-8", "a-b", "-3"):
        with pytest.raises(WorkloadError):
            OutputLength.parse(bad)


def test_poisson_arrivals() -> None:
    a = poisson_arrivals(200.0, duration_s=30.0, count=None, seed=1)
    assert a == sorted(a) and a[-1] <= 30.0
    assert 5400 < len(a) < 6600  # 6000 expected; sd ~77
    gaps = [y - x for x, y in zip(a, a[1:])]
    assert sum(gaps) / len(gaps) == pytest.approx(1 / 200, rel=0.05)
    assert poisson_arrivals(200.0, duration_s=30.0, count=None, seed=1) == a  # seeded
    assert len(poisson_arrivals(5.0, duration_s=None, count=17)) == 17
    assert len(poisson_arrivals(5.0, duration_s=1000.0, count=17)) == 17  # whichever ends first
    with pytest.raises(WorkloadError):
        poisson_arrivals(0.0, duration_s=1.0, count=None)


def test_workload_prompts_do_not_follow_the_arm() -> None:
    prompts = [Prompt(f"p{i}") for i in range(4)]
    w = Workload(prompts, OutputLength.parse("5"), ArmSplit.parse("auto,off"), seed=3)
    specs = list(itertools.islice(w.requests(), 400))
    for arm in ("auto", "off"):
        seen = {s.prompt for s in specs if s.arm == arm}
        assert seen == {p.text for p in prompts}  # both arms see every prompt
    assert [s.index for s in specs] == list(range(400))
    assert specs == list(itertools.islice(Workload(prompts, OutputLength.parse("5"), ArmSplit.parse("auto,off"), seed=3).requests(), 400))


def test_only_the_speculating_arms_send_the_drafter() -> None:
    w = Workload([Prompt("p")], OutputLength.parse("5"), ArmSplit.parse("auto,on,off"), drafter="suffix")
    specs = list(itertools.islice(w.requests(), 6))
    assert {(s.arm, s.drafter) for s in specs} == {("auto", "suffix"), ("on", "suffix"), ("off", None)}
    plain = Workload([Prompt("p")], OutputLength.parse("5"), ArmSplit.parse("auto,off"))
    assert {s.drafter for s in itertools.islice(plain.requests(), 4)} == {None}  # the server's default


def test_load_prompts(tmp_path: Path) -> None:
    p = tmp_path / "p.jsonl"
    p.write_text('{"prompt": "hi", "max_tokens": 7}\n\n{"text_input": "yo", "priority": "high"}\n')
    assert load_prompts(p) == [Prompt("hi", 7, None), Prompt("yo", None, "high")]
    p.write_text('{"prompt": "ok"}\n{"prompt": ""}\nnope\n{"prompt": "x", "max_tokens": 0}\n')
    with pytest.raises(WorkloadError) as e:
        load_prompts(p)
    msg = str(e.value)
    assert "line 2:" in msg and "line 3: not valid JSON" in msg and "line 4: 'max_tokens'" in msg


def test_long_prompts_hold_about_the_tokens_asked_and_never_more(tiny_pair):
    tok = tiny_pair.target.tokenizer
    for n, text in zip((300, 1000), long_prompt_texts(tok, [300, 1000]), strict=True):
        got = len(tok.encode_prompt(text))  # chat template on, as spec_decode tokenizes
        assert 0.9 * n <= got <= n
