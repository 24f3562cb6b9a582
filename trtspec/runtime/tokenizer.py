"""Tokenizer wrapper: prompt encoding (chat template or raw) and decoding."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from trtspec.errors import CheckpointError, InvalidRequestError


class Tokenizer:
    """A ``transformers`` tokenizer with the few calls trtspec needs."""

    def __init__(self, hf_tokenizer: Any) -> None:
        self.hf = hf_tokenizer

    @classmethod
    def from_dir(cls, path: Path) -> Tokenizer:
        from transformers import AutoTokenizer

        try:
            return cls(AutoTokenizer.from_pretrained(str(path)))
        except Exception as e:  # transformers raises many kinds here
            raise CheckpointError(f"cannot load a tokenizer from {path}: {e}") from e

    @property
    def vocab_size(self) -> int:
        return len(self.hf)

    @property
    def has_chat_template(self) -> bool:
        return bool(getattr(self.hf, "chat_template", None))

    def eos_token_ids(self) -> frozenset[int]:
        ids = set()
        if self.hf.eos_token_id is not None:
            ids.add(int(self.hf.eos_token_id))
        return frozenset(ids)

    def encode_prompt(self, text: str, raw: bool = False) -> list[int]:
        """Token ids for ``text``: one user turn through the chat template, or as is with ``raw``."""
        if not raw and self.has_chat_template:
            ids = self.hf.apply_chat_template(
                [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True
            )
            if isinstance(ids, dict) or hasattr(ids, "keys"):  # BatchEncoding in some versions
                ids = ids["input_ids"]
            return [int(t) for t in ids]
        return [int(t) for t in self.hf.encode(text, add_special_tokens=True)]

    def encode_words(self, words: Sequence[str]) -> tuple[tuple[int, ...], ...]:
        """Each word's tokens without special tokens, as TensorRT-LLM's preprocessing encodes bad words
        (a word that encodes to nothing is left out)."""
        encoded = (tuple(int(t) for t in self.hf.encode(w, add_special_tokens=False)) for w in words)
        return tuple(ids for ids in encoded if ids)

    def render_chat(self, messages: Sequence[dict[str, str]]) -> str:
        """``messages`` (``role``/``content`` dicts) through the chat template, ready for a new assistant turn.

        The text is meant to be encoded raw (``encode_prompt(text, raw=True)``),
        which adds the tokenizer's special tokens: a BOS the template writes
        itself is dropped here so the prompt does not start with two.
        """
        if not self.has_chat_template:
            raise InvalidRequestError("this model's tokenizer has no chat template")
        text = self.hf.apply_chat_template(list(messages), add_generation_prompt=True, tokenize=False)
        bos = self.hf.bos_token
        if bos and text.startswith(bos) and self.hf.encode("", add_special_tokens=True)[:1] == [self.hf.bos_token_id]:
            text = text[len(bos):]
        return text

    def decode(self, token_ids: Sequence[int]) -> str:
        return self.hf.decode(list(token_ids), skip_special_tokens=True)

    def token_texts(self, token_ids: Sequence[int]) -> list[str]:
        """Each token's own text (special tokens included; a piece of a multi-byte character reads U+FFFD)."""
        return [self.hf.decode([int(t)], skip_special_tokens=False) for t in token_ids]

    def special_tokens(self) -> dict[str, int | None]:
        return {
            "bos": self.hf.bos_token_id,
            "eos": self.hf.eos_token_id,
            "pad": self.hf.pad_token_id,
            "unk": self.hf.unk_token_id,
        }

    def fingerprint(self) -> str:
        """Hash of the whole vocabulary (token string -> id) and the special tokens."""
        h = hashlib.sha256()
        for tok, idx in sorted(self.hf.get_vocab().items(), key=lambda kv: kv[1]):
            h.update(f"{idx}\t{tok}\n".encode())
        h.update(repr(sorted((k, v) for k, v in self.special_tokens().items() if v is not None)).encode())
        return h.hexdigest()[:16]
