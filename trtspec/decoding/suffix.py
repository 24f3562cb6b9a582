"""The ``suffix`` drafter: suffix decoding over the request's text and recent outputs.

Rule (Oliaro et al. 2024, "SuffixDecoding: Extreme Speculative Decoding for
Emerging AI Applications"; vLLM's ``suffix`` method): find the longest suffix
of the sequence, at most ``max_match`` tokens, that occurred before and was
followed by something; from there follow the most frequent continuation, token
by token, while the product of the chosen tokens' frequencies (the estimated
chance the whole draft is right) stays at or above ``min_prob``, and for no more
than ``max_spec_factor`` times the match length (a longer match earns a longer
draft), nor ``k``. The text is the request's prompt and output so far and,
when a :class:`SuffixStore` is given, the outputs of recent requests (the
proposal with more expected accepted tokens wins).

It costs no model call. Both are held in a :class:`SuffixTrie` of depth
``max_match + MAX_SPEC``: every substring of that length or shorter, with its
count. A request's trie covers its last ``window`` tokens, so memory and the
work per token are bounded however long the sequence grows.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Sequence

import torch

from trtspec.decoding.drafting import deterministic_proposal
from trtspec.decoding.types import Proposal, SamplingParams

DEFAULT_MAX_MATCH = 8
MAX_SPEC = 16  # the longest draft the trie can hold past a full match
DEFAULT_MIN_PROB = 0.1
DEFAULT_MAX_SPEC_FACTOR = 2.0
DEFAULT_WINDOW = 4096


class _Node:
    __slots__ = ("count", "children")

    def __init__(self) -> None:
        self.count = 0  # occurrences of the substring this node stands for
        self.children: dict[int, _Node] = {}


class SuffixTrie:
    """Counts of every substring of at most ``depth`` tokens of the text inserted into it.

    ``extend`` appends tokens to one running text (``O(depth)`` per token);
    ``add``/``remove`` count or un-count a whole separate text.
    """

    def __init__(self, depth: int) -> None:
        self.depth = depth
        self.root = _Node()
        self._open: list[_Node] = []  # nodes of the running text's suffixes shorter than depth, longest first

    def extend(self, tokens: Sequence[int]) -> None:
        """Append ``tokens`` to the running text."""
        for t in tokens:
            grown = [self._child(n, t) for n in self._open]
            grown.append(self._child(self.root, t))
            self._open = grown[-(self.depth - 1) :] if self.depth > 1 else []

    def add(self, text: Sequence[int]) -> None:
        """Count ``text`` as a separate text (not joined to the running one)."""
        for i in range(len(text)):
            node = self.root
            for t in text[i : i + self.depth]:
                node = self._child(node, t)

    def remove(self, text: Sequence[int], starts: int | None = None) -> None:
        """Un-count the substrings (of at most ``depth`` tokens) starting at the first
        ``starts`` positions of ``text`` (all by default) that ``extend`` or ``add``
        counted; substrings of zero count are freed."""
        for i in range(len(text) if starts is None else starts):
            node = self.root
            for t in text[i : i + self.depth]:
                child = node.children[t]
                child.count -= 1
                if child.count == 0:  # and so every substring it starts
                    del node.children[t]
                    break
                node = child

    def continuation(
        self, context: Sequence[int], max_match: int, limit: int, min_prob: float, factor: float
    ) -> tuple[list[int], float]:
        """The most frequent continuation of the longest suffix of ``context`` (at most
        ``max_match`` tokens) seen followed by something. Returns ``(tokens, score)``,
        score = expected accepted tokens (the sum of the running probabilities)."""
        for m in range(min(max_match, len(context), self.depth - 1), 0, -1):
            node: _Node | None = self.root
            for t in context[len(context) - m :]:
                node = node.children.get(t)  # type: ignore[union-attr]
                if node is None:
                    break
            if node is None or not node.children:
                continue
            out: list[int] = []
            prob, score = 1.0, 0.0
            room = min(limit, int(factor * m) or 1, self.depth - m)
            while node.children and len(out) < room:
                t, child = max(node.children.items(), key=lambda kv: kv[1].count)
                prob *= child.count / sum(c.count for c in node.children.values())
                if prob < min_prob:
                    break
                out.append(t)
                score += prob
                node = child
            return out, score
        return [], 0.0

    @property
    def nodes(self) -> int:
        """Substrings held, the root included (walks the whole trie: for tests and reports)."""
        return _size(self.root)

    def _child(self, node: _Node, t: int) -> _Node:
        child = node.children.get(t)
        if child is None:
            child = node.children[t] = _Node()
        child.count += 1
        return child


def _size(node: _Node) -> int:
    return 1 + sum(_size(c) for c in node.children.values())


class SuffixStore:
    """A bounded store of recent requests' outputs, shared by the requests of one decoder.

    Holds the last ``max_outputs`` outputs (each cut to its first ``max_tokens``).
    Thread-safe.
    """

    def __init__(self, max_outputs: int = 64, max_tokens: int = 2048, max_match: int = DEFAULT_MAX_MATCH) -> None:
        self.max_outputs, self.max_tokens = max_outputs, max_tokens
        self._trie = SuffixTrie(max_match + MAX_SPEC)
        self._outputs: deque[tuple[int, ...]] = deque()
        self._lock = threading.Lock()

    def add(self, output: Sequence[int]) -> None:
        text = tuple(output[: self.max_tokens])
        if not text or self.max_outputs <= 0:
            return
        with self._lock:
            self._trie.add(text)
            self._outputs.append(text)
            while len(self._outputs) > self.max_outputs:
                self._trie.remove(self._outputs.popleft())

    def continuation(
        self, context: Sequence[int], max_match: int, limit: int, min_prob: float, factor: float
    ) -> tuple[list[int], float]:
        with self._lock:
            return self._trie.continuation(context, max_match, limit, min_prob, factor)

    @property
    def nodes(self) -> int:
        return self._trie.nodes


class SuffixDrafter:
    """Suffix decoding for one request (see the module docstring)."""

    name = "suffix"

    def __init__(
        self,
        vocab_size: int,
        prompt_len: int = 0,
        store: SuffixStore | None = None,
        max_match: int = DEFAULT_MAX_MATCH,
        min_prob: float = DEFAULT_MIN_PROB,
        max_spec_factor: float = DEFAULT_MAX_SPEC_FACTOR,
        window: int = DEFAULT_WINDOW,
    ) -> None:
        if max_match < 1 or window <= max_match + MAX_SPEC:
            raise ValueError(f"suffix drafter needs max_match >= 1 and window > max_match + {MAX_SPEC}")
        self.vocab_size, self.prompt_len, self.store = vocab_size, prompt_len, store
        self.max_match, self.min_prob, self.factor, self.window = max_match, min_prob, max_spec_factor, window
        self.trie = SuffixTrie(max_match + MAX_SPEC)
        self._text: list[int] = []  # the committed tokens seen so far
        self._dropped = 0  # substrings starting before this index have left the window

    def propose(
        self, tokens: Sequence[int], k: int, sampling: SamplingParams, generator: torch.Generator | None
    ) -> Proposal:
        self._see(tokens)
        limit = min(k, MAX_SPEC)
        best, score = self.trie.continuation(self._text, self.max_match, limit, self.min_prob, self.factor)
        if self.store is not None:
            other, other_score = self.store.continuation(self._text, self.max_match, limit, self.min_prob, self.factor)
            if other_score > score:
                best = other
        return deterministic_proposal(best, sampling, self.vocab_size)

    def rollback(self, length: int) -> None:
        return None  # it holds committed tokens only; nothing to drop

    def close(self) -> None:
        if self.store is not None:
            self.store.add(self._text[self.prompt_len :])
        self.trie = SuffixTrie(1)
        self._text = []

    def _see(self, tokens: Sequence[int]) -> None:
        """Count the tokens not seen yet; un-count substrings starting before the window."""
        seen = len(self._text)
        self._text.extend(int(t) for t in tokens[seen:])
        lo = len(self._text) - self.window  # substrings starting before lo leave the window
        if lo >= seen:  # everything counted so far leaves: start over on the window
            self.trie = SuffixTrie(self.trie.depth)
            self.trie.extend(self._text[lo:])
        else:
            self.trie.extend(self._text[seen:])
            if lo > self._dropped:
                self.trie.remove(self._text[self._dropped : lo + self.trie.depth], starts=lo - self._dropped)
        self._dropped = max(self._dropped, lo)
