"""The model side of the draft/target protocol: common-prefix reuse, rollback, LRU, re-prefill."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from trtspec.errors import InvalidRequestError
from trtspec.serving.sessions import SessionStore
from trtspec.decoding import SamplingParams
from trtspec.decoding.drafting import propose_locally

ATOL = 1e-4


@pytest.fixture(scope="module")
def lm(tiny_target: Path):
    from trtspec.runtime.torch.loader import load_model

    return load_model(tiny_target).lm


def fresh(lm, ids, num_logits):
    """Logits of a brand-new session fed ``ids`` in one pass: what every call must equal."""
    s = lm.new_session()
    out = s.forward(list(ids), num_logits)
    s.close()
    return out


def seq(n, start=3):
    return [(start + 7 * i) % 300 + 1 for i in range(n)]


def test_calls_equal_a_fresh_prefill_while_reusing_the_cached_prefix(lm):
    store = SessionStore(lm, max_sessions=4)
    ids = seq(12)
    torch.testing.assert_close(store.run("a", ids[:8], 1), fresh(lm, ids[:8], 1), atol=ATOL, rtol=0)
    torch.testing.assert_close(store.run("a", ids[:9], 1), fresh(lm, ids[:9], 1), atol=ATOL, rtol=0)  # decode step
    torch.testing.assert_close(store.run("a", ids, 3), fresh(lm, ids, 3), atol=ATOL, rtol=0)  # verify 3
    assert store.stats.tokens_fed == 8 + 1 + 3  # each token ran once
    # Logits asked for a cached position: that position is fed again (its logits were not kept).
    torch.testing.assert_close(store.run("a", ids, 4), fresh(lm, ids, 4), atol=ATOL, rtol=0)
    assert store.stats.tokens_fed == 12 + 4
    assert store.stats.hits == 3 and store.stats.misses == 1


def test_a_shorter_or_diverging_sequence_rolls_the_cache_back(lm):
    store = SessionStore(lm, max_sessions=4)
    ids = seq(10)
    store.run("a", ids, 1)
    other = ids[:6] + [5, 6, 7]  # diverges at position 6: rejected drafts replaced
    torch.testing.assert_close(store.run("a", other, 3), fresh(lm, other, 3), atol=ATOL, rtol=0)
    assert store.cached_tokens("a") == len(other)
    torch.testing.assert_close(store.run("a", ids[:4], 1), fresh(lm, ids[:4], 1), atol=ATOL, rtol=0)  # pure rollback


def test_num_logits_zero_on_an_unchanged_sequence_runs_nothing(lm):
    store = SessionStore(lm, max_sessions=2)
    store.run("a", seq(5), 1)
    fed = store.stats.tokens_fed
    out = store.run("a", seq(5), 0)
    assert out.shape == (0, lm.vocab_size) and store.stats.tokens_fed == fed


@pytest.mark.parametrize("tied", [False, True])
def test_argmax_calls_answer_the_logits_argmax(tiny_target, tied_target, tied):
    """``return_argmax``'s path: the session's ``forward_argmax`` (an ``ArgmaxHead`` where the tied
    float32 target on this CPU has one), the same ids as the logits' argmax, and nothing on an
    unchanged sequence."""
    from trtspec.runtime.torch.loader import load_model

    model = load_model(tied_target if tied else tiny_target).lm
    store = SessionStore(model, max_sessions=4)
    ids = seq(12)
    for end, num_logits in ((8, 1), (9, 1), (12, 3), (10, 2)):  # prefill, decode, verify, rollback
        got = store.run("a", ids[:end], num_logits, argmax=True)
        assert got.dtype == torch.int64 and got.tolist() == fresh(model, ids[:end], num_logits).argmax(-1).tolist()
    assert store.run("a", ids[:10], 0, argmax=True).shape == (0,)


def test_lru_eviction_then_a_miss_re_prefills_to_the_same_logits(lm):
    store = SessionStore(lm, max_sessions=2)
    store.run("a", seq(6, 1), 1)
    store.run("b", seq(6, 2), 1)
    store.run("a", seq(7, 1), 1)  # a is now the most recent
    store.run("c", seq(6, 3), 1)  # evicts b, the least recently used
    assert "b" not in store and "a" in store and "c" in store and store.stats.evictions == 1
    misses = store.stats.misses
    torch.testing.assert_close(store.run("b", seq(8, 2), 2), fresh(lm, seq(8, 2), 2), atol=ATOL, rtol=0)
    assert store.stats.misses == misses + 1


def test_release_frees_the_session(lm):
    store = SessionStore(lm, max_sessions=2)
    store.run("a", seq(4), 1)
    assert store.release("a") and "a" not in store and len(store) == 0
    assert not store.release("a")


@pytest.mark.parametrize(
    ("ids", "num_logits", "message"),
    [
        ([], 0, "token_ids is empty"),
        ([1, 2], 3, "num_logits must be in [0, 2]"),
        ([1, 9999], 1, "token ids must be in [0, 384)"),
        ([1] * 300, 1, "sequence has 300 tokens; this model's context holds 256"),
    ],
)
def test_bad_calls_raise_and_leave_the_store_usable(lm, ids, num_logits, message):
    store = SessionStore(lm, max_sessions=2)
    store.run("a", seq(4), 1)
    with pytest.raises(InvalidRequestError, match=re.escape(message)):
        store.run("a", ids, num_logits)
    torch.testing.assert_close(store.run("a", seq(5), 1), fresh(lm, seq(5), 1), atol=ATOL, rtol=0)


class _FailOnce:
    """The real model, whose sessions fail their next forward once ``armed`` (a runtime fault)."""

    def __init__(self, lm):
        self._lm, self.armed = lm, False
        self.vocab_size, self.max_context = lm.vocab_size, lm.max_context

    def new_session(self, session_id=""):
        inner, outer = self._lm.new_session(session_id), self

        class S:
            num_cached = property(lambda _: inner.num_cached)
            truncate = staticmethod(inner.truncate)
            close = staticmethod(inner.close)

            @staticmethod
            def forward(ids, n):
                if outer.armed:
                    outer.armed = False
                    raise RuntimeError("device fault")
                return inner.forward(ids, n)

        return S()


def test_a_failed_forward_drops_the_cache_and_the_next_call_re_prefills(lm):
    flaky = _FailOnce(lm)
    store = SessionStore(flaky, max_sessions=2)
    store.run("a", seq(6), 1)
    flaky.armed = True
    with pytest.raises(RuntimeError, match="device fault"):
        store.run("a", seq(8), 1)
    assert "a" not in store
    torch.testing.assert_close(store.run("a", seq(8), 2), fresh(lm, seq(8), 2), atol=ATOL, rtol=0)


@pytest.mark.parametrize(
    "sampling",
    [SamplingParams(), SamplingParams(temperature=0.8, top_k=40, top_p=0.9)],
    ids=["greedy", "sampled"],
)
def test_propose_equals_local_drafting_and_leaves_the_cache_holding_k_minus_1_drafts(lm, sampling):
    store = SessionStore(lm, max_sessions=4)
    ids = seq(10)
    # First proposal on a fresh session, then after a rollback (a diverging sequence).
    for prefix in (ids, ids[:6] + [5]):
        proposal = store.propose("d", prefix, 4, sampling, seed=123)
        ref_session = lm.new_session()
        ref = propose_locally(ref_session, prefix, 4, sampling, torch.Generator().manual_seed(123))
        assert proposal.tokens == ref.tokens
        if sampling.greedy:
            assert proposal.q is None
        else:
            torch.testing.assert_close(proposal.q, ref.q, atol=ATOL, rtol=0)
        assert store.cached_tokens("d") == len(prefix) + 3
        # the cache now continues exactly like a fresh prefill of what it holds
        held = list(prefix) + list(proposal.tokens[:3])
        torch.testing.assert_close(
            store.run("d", held + [proposal.tokens[3]], 1), fresh(lm, held + [proposal.tokens[3]], 1), atol=ATOL, rtol=0
        )


@pytest.mark.parametrize("tied", [False, True])
def test_greedy_local_drafting_by_argmax_ids_drafts_the_logits_argmax(tiny_target, tied_target, tied):
    """Greedy drafting asks the session for argmax ids (``forward_argmax``; an ``ArgmaxHead`` where the
    tied float32 model on this CPU has one): the drafts of the logits' argmax, the same cache after."""
    from trtspec.runtime.torch.loader import load_model

    model = load_model(tied_target if tied else tiny_target).lm
    by_ids, by_logits = model.new_session(), model.new_session()
    want, prefix = [], seq(10)
    logits = by_logits.forward(prefix, 1)
    for i in range(5):
        want.append(int(logits[0].argmax()))
        if i < 4:
            logits = by_logits.forward(want[-1:], 1)
    assert propose_locally(by_ids, prefix, 5, SamplingParams(), None).tokens == tuple(want)
    assert by_ids.num_cached == by_logits.num_cached == 10 + 4


def test_propose_rejects_bad_arguments(lm):
    store = SessionStore(lm, max_sessions=4)
    with pytest.raises(InvalidRequestError, match="num_draft must be >= 1"):
        store.propose("x", seq(4), 0, SamplingParams(), None)
    with pytest.raises(InvalidRequestError, match="context holds"):
        store.propose("x", seq(250), 10, SamplingParams(), None)  # the tiny models hold 256 tokens
