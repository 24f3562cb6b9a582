"""Can this draft speculate for this target? Checked before anything runs."""

from __future__ import annotations

from dataclasses import dataclass

from trtspec.errors import IncompatibleModelsError
from trtspec.runtime.tokenizer import Tokenizer

# Text whose tokenization exercises words, numbers, whitespace, punctuation,
# code and non-ASCII; both tokenizers must give the same ids for each.
PROBES = (
    "Hello, world!",
    "The quick brown fox jumps over the lazy dog.",
    "  leading spaces and\ttabs\nnewlines",
    "1234567890 3.14159 -42",
    "def f(x):\n    return x ** 2  # square",
    "naïve café, Zürich, 東京, 🙂",
    "<|im_start|>user\nhi<|im_end|>",
)


@dataclass(frozen=True)
class CompatReport:
    vocab_size: int
    tokenizer_fingerprint: str
    target_max_context: int
    draft_max_context: int | None  # None: no draft model
    probes_checked: int

    @property
    def max_context(self) -> int:
        """Speculation runs while the sequence fits both models (the target's alone without a draft)."""
        return min(self.target_max_context, self.draft_max_context or self.target_max_context)

    def to_dict(self) -> dict:
        return {
            "vocab_size": self.vocab_size,
            "tokenizer_fingerprint": self.tokenizer_fingerprint,
            "target_max_context": self.target_max_context,
            "draft_max_context": self.draft_max_context,
            "probes_checked": self.probes_checked,
        }


def check_compatible(
    target_tok: Tokenizer,
    draft_tok: Tokenizer,
    target_vocab: int,
    draft_vocab: int,
    target_max_context: int,
    draft_max_context: int,
) -> CompatReport:
    """Raise :class:`IncompatibleModelsError` naming the first mismatch found."""
    if target_vocab != draft_vocab:
        raise IncompatibleModelsError(
            f"vocabulary size mismatch: target logits have {target_vocab} entries, draft has {draft_vocab}"
        )
    if len(target_tok.hf) != len(draft_tok.hf):
        raise IncompatibleModelsError(
            f"tokenizer mismatch: target tokenizer has {len(target_tok.hf)} tokens, draft has {len(draft_tok.hf)}"
        )
    t_special, d_special = target_tok.special_tokens(), draft_tok.special_tokens()
    for name in ("bos", "eos", "pad", "unk"):
        if t_special[name] is not None and d_special[name] is not None and t_special[name] != d_special[name]:
            raise IncompatibleModelsError(
                f"special token {name!r} differs: target id {t_special[name]}, draft id {d_special[name]}"
            )
    for text in PROBES:
        t_ids = target_tok.hf.encode(text, add_special_tokens=False)
        d_ids = draft_tok.hf.encode(text, add_special_tokens=False)
        if list(t_ids) != list(d_ids):
            raise IncompatibleModelsError(
                f"tokenizers disagree on {text!r}: target ids {list(t_ids)[:8]}, draft ids {list(d_ids)[:8]}"
            )
    t_fp, d_fp = target_tok.fingerprint(), draft_tok.fingerprint()
    if t_fp != d_fp:
        raise IncompatibleModelsError(
            f"vocabularies differ (token strings or ids): target fingerprint {t_fp}, draft {d_fp}"
        )
    if draft_max_context < 2:
        raise IncompatibleModelsError(f"draft context window is {draft_max_context} tokens; too small to draft")
    return CompatReport(
        vocab_size=target_vocab,
        tokenizer_fingerprint=t_fp,
        target_max_context=target_max_context,
        draft_max_context=draft_max_context,
        probes_checked=len(PROBES),
    )


def target_facts(target_tok: Tokenizer, target_vocab: int, target_max_context: int) -> CompatReport:
    """The report of a target served without a draft model: its own facts, nothing compared."""
    return CompatReport(
        vocab_size=target_vocab,
        tokenizer_fingerprint=target_tok.fingerprint(),
        target_max_context=target_max_context,
        draft_max_context=None,
        probes_checked=0,
    )
