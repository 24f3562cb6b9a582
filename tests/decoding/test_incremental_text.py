"""IncrementalText: the output's text at every step equals decoding all of it, for real tokenizers
(multi-byte characters split across tokens, special tokens skipped) and for a decoder that joins across
token boundaries (where it must fall back to decoding everything)."""

from __future__ import annotations

import random

import pytest

from trtspec.decoding.stopping import IncrementalText
from trtspec.runtime.tokenizer import Tokenizer


class Joining:
    """A SentencePiece-like decoder: pieces joined, the text's leading space dropped, and " ." cleaned to
    "." (as ``clean_up_tokenization_spaces`` does): both reach across token boundaries."""

    PIECES = [" a", " ", ".", "b", " .", "\ufffd", "é", " c", ""]

    def __init__(self) -> None:
        self.calls = 0

    def decode(self, ids) -> str:
        self.calls += 1
        return "".join(self.PIECES[i] for i in ids).replace(" .", ".").removeprefix(" ")


def grow(decode, vocab: int, rng: random.Random, steps: int = 60):
    """Token lists growing by 1-6 random tokens; the incremental text and the full decode at each step."""
    inc, ids = IncrementalText(decode), []
    for _ in range(steps):
        ids += [rng.randrange(vocab) for _ in range(rng.randint(1, 6))]
        yield inc.of(ids), decode.decode(ids)


def test_a_decoder_that_joins_across_tokens_gets_the_full_decode_text():
    d = Joining()
    for seed in range(50):
        for got, want in grow(d, len(Joining.PIECES), random.Random(seed)):
            assert got == want


@pytest.mark.parametrize("which", ["tiny", "demo"])
def test_real_tokenizers_give_the_full_decode_text(which, tiny_target, demo_pair_paths):
    tok = Tokenizer.from_dir(tiny_target if which == "tiny" else demo_pair_paths.target)
    vocab = tok.hf.vocab_size
    text = "naïve café — 東京 🚀 déjà vu, \"quotes\" (and) spaces  .. end.\n" * 4
    ids = tok.encode_prompt(text, raw=True)
    rng = random.Random(0)
    for _ in range(5):  # real text, grown a few tokens at a time
        inc = IncrementalText(tok)
        for end in range(1, len(ids) + 1, rng.randint(1, 4)):
            assert inc.of(ids[:end]) == tok.decode(ids[:end])
    for seed in range(5):  # random ids, byte pieces and special tokens among them
        for got, want in grow(tok, vocab, random.Random(seed)):
            assert got == want


def test_a_long_output_decodes_a_few_tokens_per_step_not_all_of_them():
    class Counting:
        decoded = 0

        def decode(self, ids) -> str:
            self.decoded += len(ids)
            return "".join(f"<{i}>" for i in ids)

    d = Counting()
    inc, ids = IncrementalText(d), []
    for t in range(2000):
        ids.append(t)
        assert inc.of(ids).endswith(f"<{t}>")
    assert d.decoded < 20 * 2000  # decoding all of it each step: 2,001,000 tokens
    before = d.decoded
    assert inc.of(ids) == d.decode(ids) and d.decoded == before + len(ids)  # asked again: nothing decoded
