"""The free drafters (n-gram prompt lookup, suffix decoding) on crafted token streams."""

from __future__ import annotations

import dataclasses
import random

import pytest
import torch

from trtspec.decoding import DrafterKind, DrafterOptions, GenerationRequest, SamplingParams, StopCriteria
from trtspec.decoding.drafters import open_drafters
from trtspec.decoding.ngram import NgramDrafter
from trtspec.decoding.protocols import Drafter
from trtspec.decoding.suffix import MAX_SPEC, SuffixDrafter, SuffixStore, SuffixTrie
from trtspec.testing.fakes import BigramLM

GREEDY = SamplingParams()
V = 100


def ngram(tokens, k=4, **kw) -> tuple[int, ...]:
    return NgramDrafter(V, **kw).propose(tokens, k, GREEDY, None).tokens


def suffix(tokens, k=4, **kw) -> tuple[int, ...]:
    return SuffixDrafter(V, **kw).propose(tokens, k, GREEDY, None).tokens


def test_every_drafter_meets_the_contract():
    req = GenerationRequest((1, 2), StopCriteria(4), drafter=DrafterKind.AUTO)
    drafters = open_drafters(req, V, BigramLM.random(V, seed=0), DrafterOptions())
    assert [d.name for d in drafters] == ["suffix", "model"]
    assert all(isinstance(d, Drafter) for d in drafters)
    assert isinstance(NgramDrafter(V), Drafter)


# -- ngram -----------------------------------------------------------------------------


def test_ngram_proposes_what_followed_the_last_tokens():
    assert ngram([1, 2, 3, 4, 5, 6, 9, 1, 2, 3], k=3) == (4, 5, 6)


def test_ngram_tries_the_longest_match_first():
    # "2 3" was last followed by 8; "1 2 3" (longer) by 4: the longer match wins
    assert ngram([1, 2, 3, 4, 5, 7, 2, 3, 8, 9, 1, 2, 3], k=2) == (4, 5)
    # max_n = 2 sees only "2 3": its most recent occurrence decides
    assert ngram([1, 2, 3, 4, 5, 7, 2, 3, 8, 9, 1, 2, 3], k=2, max_n=2) == (8, 9)


def test_ngram_takes_the_most_recent_occurrence():
    assert ngram([5, 6, 1, 9, 5, 6, 2, 9, 5, 6], k=2, min_n=2, max_n=2) == (2, 9)


def test_ngram_without_a_match_proposes_nothing():
    assert ngram([1, 2, 3, 4, 5, 6, 7]) == ()
    assert ngram([1, 2, 3, 4, 5, 3], min_n=2) == ()  # "3" alone occurs, but min_n = 2
    assert ngram([1, 2, 3, 4, 5, 3], min_n=1) == (4, 5, 3)
    assert ngram([7]) == ()


def test_ngram_match_at_the_end_of_the_text_proposes_what_there_is():
    # "1 2" last occurred right before the end: only two tokens followed it
    assert ngram([1, 2, 1, 2], k=5) == (1, 2)


def test_ngram_under_sampling_sends_probability_one_on_each_draft():
    p = NgramDrafter(V).propose([1, 2, 3, 1, 2], 3, SamplingParams(temperature=1.0), None)
    assert p.tokens == (3, 1, 2)
    assert p.q is not None and p.q.shape == (3, V)
    assert torch.equal(p.q.sum(dim=1), torch.ones(3)) and p.q[[0, 1, 2], [3, 1, 2]].tolist() == [1.0, 1.0, 1.0]


def test_ngram_on_a_very_long_input_keeps_a_bounded_index():
    rng = random.Random(0)
    tokens = [rng.randrange(V) for _ in range(100_000)]
    d = NgramDrafter(V, min_n=2, max_n=4, window=2048)
    for end in range(50_000, 100_000, 997):
        d.propose(tokens[:end], 4, GREEDY, None)
        assert d.index_size <= 2048 * 3
    # an occurrence that left the window is no longer matched
    far = [1, 2, 3, 4] + [rng.randrange(5, V) for _ in range(3000)] + [1, 2, 3]
    assert ngram(far, window=2048) == () and ngram(far, window=4096) == (4,) + tuple(far[4:7])


# -- suffix ----------------------------------------------------------------------------


def test_suffix_proposes_the_most_frequent_continuation():
    # "1 2" was followed by 3 twice and by 4 once
    text = [1, 2, 3, 9, 1, 2, 4, 9, 1, 2, 3, 9, 1, 2]
    assert suffix(text, k=2, max_match=2) == (3, 9)


def test_suffix_draft_length_grows_with_the_match():
    copy = list(range(10, 40))
    assert suffix(copy + copy[:1], k=16) == tuple(copy[1:3])  # match of 1: up to 2 tokens
    assert suffix(copy + copy[:6], k=16) == tuple(copy[6:18])  # match of 6: up to 12 tokens
    assert suffix(copy + copy[:6], k=5) == tuple(copy[6:11])  # never more than k


def test_suffix_stops_where_the_continuation_is_unlikely():
    # after "5 6": 7 once, 8 once (1/2 each); after "5 6 7" always 1, and so on
    text = [5, 6, 7, 1, 5, 6, 8, 2, 5, 6]
    assert suffix(text, k=4, min_prob=0.5) == (7, 1, 5, 6)  # the whole draft has chance 1/2
    assert suffix(text, k=4, min_prob=0.6) == ()


def test_suffix_without_a_match_proposes_nothing():
    assert suffix([1, 2, 3, 4, 5]) == ()


def test_suffix_store_drafts_from_an_earlier_requests_output():
    store = SuffixStore(max_outputs=2)
    first = SuffixDrafter(V, prompt_len=2, store=store)
    first.propose([50, 51, 20, 21, 22, 23, 24, 25], 4, GREEDY, None)  # output 20..25 seen
    first.close()
    second = SuffixDrafter(V, prompt_len=2, store=store)
    assert second.propose([60, 61, 20, 21, 22], 4, GREEDY, None).tokens == (23, 24, 25)
    # the store holds only the last two outputs
    for out in ([30, 31], [40, 41]):
        store.add(out)
    assert SuffixDrafter(V, store=store).propose([20, 21, 22], 4, GREEDY, None).tokens == ()


def test_suffix_store_forgets_exactly_what_it_added():
    store = SuffixStore(max_outputs=1)
    store.add([1, 2, 3, 1, 2, 4])
    store.add([7, 8])
    fresh = SuffixStore(max_outputs=1)
    fresh.add([7, 8])
    assert _dump(store._trie.root) == _dump(fresh._trie.root)


def test_suffix_window_bounds_memory_and_counts_only_the_window():
    rng = random.Random(1)
    tokens = [rng.randrange(20) for _ in range(30_000)]
    d = SuffixDrafter(V, window=1000, max_match=4)
    for end in range(5_000, 30_000, 1234):
        d.propose(tokens[:end], 4, GREEDY, None)
        assert d.trie.nodes <= 1000 * d.trie.depth + 1
    window = SuffixTrie(d.trie.depth)
    window.extend(tokens[end - 1000 : end])
    assert _dump(d.trie.root) == _dump(window.root)  # sliding left exactly the window's counts


def _dump(node) -> dict:
    return {t: (c.count, _dump(c)) for t, c in sorted(node.children.items())}


def test_suffix_depth_is_match_plus_spec():
    assert SuffixDrafter(V, max_match=5).trie.depth == 5 + MAX_SPEC


@pytest.mark.parametrize("kind", [DrafterKind.NGRAM, DrafterKind.SUFFIX])
def test_free_drafters_never_draft_past_what_they_saw(kind):
    """They hold committed tokens only: rollback is a no-op and a proposal is repeatable."""
    req = dataclasses.replace(GenerationRequest((1, 2, 3, 1, 2), StopCriteria(4)), drafter=kind)
    (d,) = open_drafters(req, V, None, DrafterOptions())
    first = d.propose([1, 2, 3, 1, 2], 3, GREEDY, None)
    d.rollback(5)
    assert d.propose([1, 2, 3, 1, 2], 3, GREEDY, None) == first and first.tokens[0] == 3
