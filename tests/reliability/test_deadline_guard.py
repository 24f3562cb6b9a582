"""The adaptive draft deadline, the guarded model that enforces it, and what the loop does with a
late draft (real threads, no server)."""

from __future__ import annotations

import threading
import time
from collections.abc import Container
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from trtspec.control import SpeculationGovernor
from trtspec.control.config import Policy
from trtspec.decoding import FixedDraftLength, GenerationRequest, SpeculativeDecoder, StopCriteria
from trtspec.decoding.loop import MAX_LATE_DRAFTS
from trtspec.decoding.types import Proposal, SamplingParams
from trtspec.errors import ModelTimeoutError
from trtspec.serving.deadline import PRIOR_READ_TOKENS, READ_MIN_TOKENS, AdaptiveDeadline, Work, WorkDeadline
from trtspec.serving.guard import GuardedModel
from trtspec.serving.triton.health import DeploymentHealth, HealthConfig
from trtspec.testing import fake_triton


def test_deadline_is_max_until_measured_then_multiplier_times_p95_clamped():
    d = AdaptiveDeadline(floor_s=0.01, max_s=1.0, multiplier=4.0, min_samples=4, window=100)
    assert d.deadline_s() == 1.0  # nothing measured yet
    for s in (0.010, 0.011, 0.012, 0.013):
        d.observe(s)
    assert d.p95_s() == pytest.approx(0.013) and d.deadline_s() == pytest.approx(0.052)
    for _ in range(100):
        d.observe(0.5)  # a slow draft: 4 x 0.5 is above the ceiling
    assert d.deadline_s() == 1.0
    fast = AdaptiveDeadline(floor_s=0.05, max_s=1.0, min_samples=1)
    fast.observe(0.001)
    assert fast.deadline_s() == 0.05  # the floor


def test_a_call_queued_behind_running_ones_gets_their_time_too_within_the_ceiling():
    d = AdaptiveDeadline(floor_s=0.01, max_s=1.0, multiplier=4.0, min_samples=1)
    d.observe(0.05)
    assert d.deadline_s() == pytest.approx(0.2)
    assert d.deadline_s(Work(tokens=0, calls_ahead=2)) == pytest.approx(0.6)  # two calls to wait for, then its own
    assert d.deadline_s(Work(tokens=0, calls_ahead=7)) == 1.0  # the ceiling still holds
    assert AdaptiveDeadline(fixed_s=0.3).deadline_s(Work(tokens=900, calls_ahead=5)) == 0.3  # a fixed deadline is fixed


def test_a_call_that_reads_gets_the_time_of_its_reads_too_and_so_does_one_queued_behind_it():
    d = AdaptiveDeadline(floor_s=0.01, max_s=1.0, multiplier=4.0, min_samples=4)
    proposal = Work(tokens=6, drafted=5)  # reads the last correction token, drafts 5
    for _ in range(200):
        d.observe(0.05, proposal)
    first = Work(tokens=405, drafted=5)  # a request's first proposal reads its prompt
    assert first.reads == 400
    # Until measured, the read rate is a call's p95 per PRIOR_READ_TOKENS; the ceiling bounds the calls' term only.
    assert d.deadline_s(first) == pytest.approx(0.2 + 4 * 0.05 / PRIOR_READ_TOKENS * 400)
    for _ in range(3):
        d.observe(9.0, Work(tokens=405, drafted=5, calls_ahead=1))  # queued behind another: not its read's time
        d.observe(0.5, Work(tokens=READ_MIN_TOKENS - 1))  # too few tokens to tell a read's time
    assert d.snapshot()["read_s_per_token"] is None
    for _ in range(3):
        d.observe(0.45, first)  # 0.4 s beyond a typical call for 400 tokens: 1 ms a token
    assert d.snapshot()["read_s_per_token"] == pytest.approx(0.001)
    assert d.p95_s() == pytest.approx(0.05)
    assert d.deadline_s(first) == pytest.approx(0.2 + 4 * 0.001 * 400)
    behind = Work(tokens=6, drafted=5, calls_ahead=1, tokens_ahead=405, drafted_ahead=5)
    assert d.deadline_s(behind) == pytest.approx(0.4 + 4 * 0.001 * 401)  # two calls, and the read ahead


def test_p95_ignores_the_slowest_five_percent_and_late_calls_are_not_measured():
    d = AdaptiveDeadline(floor_s=0.0, max_s=10.0, multiplier=2.0, min_samples=1, window=100)
    for i in range(95):
        d.observe(0.01)
    for i in range(5):
        d.observe(3.0)  # 5% outliers
    assert d.p95_s() == pytest.approx(0.01)
    d.observe_late()
    assert d.snapshot()["late"] == 1 and d.snapshot()["on_time"] == 100


def test_fixed_deadline_ignores_measurements():
    d = AdaptiveDeadline(fixed_s=0.2)
    for _ in range(50):
        d.observe(5.0)
    assert d.deadline_s() == 0.2 and d.snapshot()["fixed"] is True


def test_bad_settings_are_refused():
    with pytest.raises(ValueError):
        AdaptiveDeadline(floor_s=2.0, max_s=1.0)
    with pytest.raises(ValueError):
        AdaptiveDeadline(multiplier=0.5)


# -- the guard -----------------------------------------------------------------------


class Hooks:
    def __init__(self) -> None:
        self.ok: list[float] = []
        self.ok_work: list[Work] = []
        self.late: list[tuple[int, float]] = []
        self.errors: list[tuple[int, BaseException]] = []
        self.error_seen = threading.Event()
        self.late_answers = 0

    def on_ok(self, seconds: float, work: Work) -> None:
        self.ok.append(seconds)
        self.ok_work.append(work)

    def on_late(self, k: int, deadline_s: float) -> None:
        self.late.append((k, deadline_s))

    def on_error(self, k: int, error: BaseException, started_at: float) -> None:
        self.errors.append((k, error))
        self.error_seen.set()

    def on_late_answer(self) -> None:
        self.late_answers += 1


class GatedDraft:
    """A proposing draft whose calls block until ``gate`` is set (so lateness is certain, not timed),
    then propose the target's own greedy tokens (or raise ``fail``)."""

    vocab_size = 16
    max_context = 64

    def __init__(self, gate: threading.Event, fail: BaseException | None = None) -> None:
        self.gate = gate
        self.fail = fail
        self.closed = threading.Event()

    def new_session(self, session_id: str = "") -> GatedSession:
        return GatedSession(self)


class GatedSession:
    def __init__(self, owner: GatedDraft) -> None:
        self.owner = owner
        self.num_cached = 0

    def forward(self, token_ids, num_logits):
        raise AssertionError("a proposing draft is driven through propose")

    def propose(self, token_ids, k, sampling, seed, text=()):
        self.owner.gate.wait(30)
        if self.owner.fail is not None:
            raise self.owner.fail
        self.num_cached += len(token_ids) + k - 1
        return Proposal(tokens=tuple((len(token_ids) + i) % 16 for i in range(k)), q=None)

    def truncate(self, length):
        self.num_cached = length

    def close(self):
        self.owner.closed.set()


class CountingTarget:
    """Deterministic logits: the next token is (position * 7) % vocab."""

    vocab_size = 16
    max_context = 64

    def new_session(self, session_id: str = ""):
        return CountingSession()


class CountingSession:
    def __init__(self) -> None:
        self.num_cached = 0

    def forward(self, token_ids, num_logits):
        self.num_cached += len(token_ids)
        rows = []
        for pos in range(self.num_cached - num_logits, self.num_cached):
            row = torch.zeros(16)
            row[(pos * 7) % 16] = 10.0
            rows.append(row)
        return torch.stack(rows) if rows else torch.zeros((0, 16))

    def truncate(self, length):
        self.num_cached = length

    def close(self):
        pass


class Late(Exception):
    pass


def run(draft_model) -> tuple:
    req = GenerationRequest(prompt_ids=(1, 2, 3), stop=StopCriteria(max_new_tokens=12))
    with_draft = SpeculativeDecoder(CountingTarget(), draft_model).generate(req, FixedDraftLength(4))
    alone = SpeculativeDecoder(CountingTarget(), None).generate(req, FixedDraftLength(0))
    return with_draft, alone


def test_a_late_draft_is_dropped_and_the_request_goes_on_with_the_target_alone():
    gate = threading.Event()  # never set while the request runs: every draft call is late
    hooks = Hooks()
    pool = ThreadPoolExecutor(4)
    draft = GatedDraft(gate)
    guarded = GuardedModel(draft, pool, lambda work: 0.05, hooks, late_error=lambda s: Late(f"late after {s}s"),
                           close_async=True)
    try:
        got, alone = run(guarded)
    finally:
        gate.set()
        pool.shutdown(wait=True)
    assert got.token_ids == alone.token_ids  # nothing lost or repeated
    assert got.stats.draft_errors == 1 and got.stats.drafted_tokens == 0
    assert hooks.late == [(4, 0.05)] and hooks.ok == [] and hooks.errors == []
    assert draft.closed.is_set()  # the release went out on the pool, after the abandoned call


def test_an_abandoned_call_that_fails_later_is_still_reported():
    gate = threading.Event()
    hooks = Hooks()
    pool = ThreadPoolExecutor(2)
    draft = GatedDraft(gate, fail=RuntimeError("Stub process 'draft_0_0' is not healthy."))
    guarded = GuardedModel(draft, pool, lambda work: 0.05, hooks, late_error=lambda s: Late("late"), close_async=True)
    session = guarded.new_session()
    with pytest.raises(Late):
        session.propose([1, 2], 3, SamplingParams(), None)
    assert hooks.late == [(3, 0.05)] and not hooks.errors
    gate.set()  # now the abandoned call fails
    assert hooks.error_seen.wait(10)
    assert hooks.errors[0][0] == 0 and "not healthy" in str(hooks.errors[0][1])  # k = 0: lateness counted already
    pool.shutdown(wait=True)


def test_on_time_calls_are_measured_and_errors_reported_with_k():
    gate = threading.Event()
    gate.set()
    hooks = Hooks()
    with ThreadPoolExecutor(2) as pool:
        ok = GuardedModel(GatedDraft(gate), pool, lambda work: 5.0, hooks, late_error=lambda s: Late())
        ok.new_session().propose([1, 2], 3, SamplingParams(), None)
        assert len(hooks.ok) == 1 and 0 <= hooks.ok[0] < 5.0
        bad = GuardedModel(GatedDraft(gate, fail=ValueError("boom")), pool, lambda work: None, hooks, late_error=lambda s: Late())
        with pytest.raises(ValueError):
            bad.new_session().propose([1, 2], 2, SamplingParams(), None)  # no deadline: inline, same reporting
    assert [(k, str(e)) for k, e in hooks.errors] == [(2, "boom")]


def test_the_guard_counts_running_calls_for_the_deadline_and_measures_one_calls_time():
    gate = threading.Event()
    hooks = Hooks()
    asked: list[Work] = []

    def deadline(work: Work) -> float:
        asked.append(work)
        return 30.0

    with ThreadPoolExecutor(4) as pool:
        guarded = GuardedModel(GatedDraft(gate), pool, deadline, hooks, late_error=lambda s: Late())
        first = threading.Thread(target=lambda: guarded.new_session().propose([1, 2], 2, SamplingParams(), None))
        first.start()
        for _ in range(500):  # the first call is running (blocked on the gate)
            if guarded.running == 1:
                break
            threading.Event().wait(0.01)
        assert guarded.running == 1
        threading.Timer(0.3, gate.set).start()
        t0 = time.perf_counter()
        guarded.new_session().propose([1, 2], 2, SamplingParams(), None)
        wall = time.perf_counter() - t0
        first.join(10)
    # the second call was made with one running ahead of it: 2 tokens to read, 2 to draft
    assert [(w.calls_ahead, w.reads, w.drafted, w.reads_ahead, w.drafted_ahead) for w in asked] == [
        (0, 2, 2, 0, 0), (1, 2, 2, 2, 2)]
    assert sorted(hooks.ok_work, key=lambda w: w.calls_ahead) == asked  # the hooks hear what each call asked
    assert guarded.running == 0
    second = min(hooks.ok)  # the first call waited longer and is measured whole; the second is halved
    assert wall >= 0.29 and 0.4 * wall <= second <= 0.5 * wall + 1e-3


class ReadingDraft:
    """A draft in its own model (a ``RemoteModel``) that takes ``read_s`` per token it reads and
    ``step_s`` per token it drafts, and drafts :class:`LongCountingTarget`'s own tokens; its calls
    numbered in ``stalls`` (from 0, over all sessions) take ``stall_s`` more. Keeps its sessions."""

    model_name = "draft"
    vocab_size = 16
    max_context = 1024

    def __init__(self, read_s: float, step_s: float, stalls: Container[int] = (), stall_s: float = 0.0) -> None:
        self.read_s, self.step_s, self.stalls, self.stall_s = read_s, step_s, stalls, stall_s
        self.calls = 0
        self.sessions: list[ReadingSession] = []

    def new_session(self, session_id: str = "") -> ReadingSession:
        self.sessions.append(ReadingSession(self))
        return self.sessions[-1]

    def probe(self) -> None:
        pass


class ReadingSession:
    def __init__(self, owner: ReadingDraft) -> None:
        self.owner = owner
        self.num_cached = 0
        self.reads: list[int] = []  # tokens read by each proposal
        self.closed = False

    def forward(self, token_ids, num_logits):
        raise AssertionError("a proposing draft is driven through propose")

    def propose(self, token_ids, k, sampling, seed, text=()):
        o = self.owner
        stall = o.stall_s if o.calls in o.stalls else 0.0
        o.calls += 1
        self.reads.append(len(token_ids))
        time.sleep(len(token_ids) * o.read_s + k * o.step_s + stall)
        n = self.num_cached + len(token_ids)
        self.num_cached = n + k - 1
        return Proposal(tokens=tuple(((n - 1 + i) * 7) % 16 for i in range(k)), q=None)

    def truncate(self, length):
        self.num_cached = length

    def close(self):
        self.closed = True


class LongCountingTarget(CountingTarget):
    max_context = 1024


def test_a_long_prompts_first_draft_call_is_on_time_where_short_calls_set_the_deadline():
    """The served draft's wiring (``DeploymentHealth``): short requests teach the deadline a
    proposal's time; a 300-token prompt's first proposal reads it all (~0.3 s, over twice a
    proposal's deadline) and still drafts, where it used to go late and leave the request on
    the target alone."""
    health = DeploymentHealth(fake_triton, HealthConfig(), SpeculationGovernor(Policy()), model_name="spec_decode",
                              pool_size=2)
    try:
        decoder = SpeculativeDecoder(LongCountingTarget(), health.guard_draft(ReadingDraft(0.001, 0.005)))
        for i in range(10):
            short = GenerationRequest(prompt_ids=(1, 2, i), stop=StopCriteria(max_new_tokens=20))
            assert decoder.generate(short, FixedDraftLength(4)).stats.draft_errors == 0
        proposal_deadline = health.draft_deadline.deadline_s(Work(tokens=5, drafted=4))
        assert proposal_deadline < 0.3 / 2
        long = GenerationRequest(prompt_ids=tuple(i % 16 for i in range(300)), stop=StopCriteria(max_new_tokens=20))
        got = decoder.generate(long, FixedDraftLength(4))
    finally:
        health.stop()
    alone = SpeculativeDecoder(LongCountingTarget(), None).generate(long, FixedDraftLength(0))
    assert got.stats.draft_errors == 0 and got.stats.accepted_tokens > 0
    assert got.token_ids == alone.token_ids


class _Recorder(FixedDraftLength):
    def __init__(self, k: int) -> None:
        super().__init__(k)
        self.outcomes: list = []

    def observe(self, outcome) -> None:
        self.outcomes.append(outcome)


def _late_run(draft: ReadingDraft) -> tuple:
    """A 40-token request at k = 4 through a guarded ``draft`` whose calls are late past 0.1 s."""
    hooks = Hooks()
    policy = _Recorder(4)
    req = GenerationRequest(prompt_ids=(1, 2, 3), stop=StopCriteria(max_new_tokens=40))
    with ThreadPoolExecutor(4) as pool:
        guarded = GuardedModel(draft, pool, lambda work: 0.1, hooks, close_async=True,
                               late_error=lambda s: ModelTimeoutError(f"late after {s}s"))
        got = SpeculativeDecoder(LongCountingTarget(), guarded).generate(req, policy)
    alone = SpeculativeDecoder(LongCountingTarget(), None).generate(req, FixedDraftLength(0))
    assert got.token_ids == alone.token_ids  # nothing lost or repeated
    return got, policy.outcomes, hooks


def test_a_late_draft_restarts_in_a_fresh_session_that_reads_everything_and_drafts_again():
    draft = ReadingDraft(0.0, 0.0, stalls={1}, stall_s=1.0)  # its second proposal stalls
    got, outcomes, hooks = _late_run(draft)
    assert got.stats.draft_errors == 1 and len(hooks.late) == 1
    failed = [o.draft_failed for o in outcomes].index(True)
    after = outcomes[failed + 1 :]
    assert all(o.k == 4 for o in after[:-1]) and sum(o.accepted for o in after) > 8  # it drafts again
    first, fresh = draft.sessions
    assert first.closed  # released (after the abandoned call)
    assert fresh.reads[0] == outcomes[failed + 1].context_len  # the fresh session read the whole sequence


def test_a_request_drops_a_draft_at_its_third_late_call():
    draft = ReadingDraft(0.0, 0.0, stalls=range(1000), stall_s=0.3)  # every call stalls
    got, outcomes, hooks = _late_run(draft)
    assert got.stats.draft_errors == MAX_LATE_DRAFTS == 3 and len(hooks.late) == 3
    assert len(draft.sessions) == 3 and all(sess.closed for sess in draft.sessions)
    last_failure = max(i for i, o in enumerate(outcomes) if o.draft_failed)
    assert all(o.k == 0 and not o.draft_failed for o in outcomes[last_failure + 1 :])  # on the target alone


class OneSessionDraft(ReadingDraft):
    def new_session(self, session_id: str = "") -> ReadingSession:
        if self.sessions:
            raise RuntimeError("cannot schedule new futures after shutdown")
        return super().new_session(session_id)


def test_a_late_draft_that_cannot_restart_is_dropped_and_the_request_goes_on():
    draft = OneSessionDraft(0.0, 0.0, stalls={1}, stall_s=1.0)
    got, outcomes, _hooks = _late_run(draft)  # the same tokens as the target alone
    assert got.stats.draft_errors == 1 and len(draft.sessions) == 1
    failed = [o.draft_failed for o in outcomes].index(True)
    assert all(o.k == 0 for o in outcomes[failed:])


# -- work-scaled deadlines, progress, chunked prefill ------------------------------------


def test_work_deadline_grows_with_the_tokens_of_the_pass_and_of_the_calls_ahead():
    d = WorkDeadline(base_s=30.0, per_token_s=0.05)
    assert d(Work(tokens=1)) == pytest.approx(30.05)  # a decode step
    assert d(Work(tokens=6700)) == pytest.approx(365.0)  # a long prompt's prefill
    assert d(Work(tokens=1, calls_ahead=1, tokens_ahead=512)) == pytest.approx(55.65)  # behind a prefill chunk
    with pytest.raises(ValueError):
        WorkDeadline(base_s=0.0, per_token_s=0.05)


class RecordingLM:
    """An in-process LM (the tiny target) whose sessions record the size of every pass."""

    def __init__(self, lm) -> None:
        self.lm = lm
        self.passes: list[tuple[int, int]] = []  # (tokens, num_logits)
        self.vocab_size = lm.vocab_size
        self.max_context = lm.max_context

    def new_session(self, session_id: str = ""):
        inner = self.lm.new_session(session_id)
        outer = self

        class Session:
            num_cached = property(lambda self: inner.num_cached)

            def forward(self, token_ids, num_logits):
                outer.passes.append((len(token_ids), num_logits))
                return inner.forward(token_ids, num_logits)

            def truncate(self, length):
                inner.truncate(length)

            def close(self):
                inner.close()

        return Session()


def test_a_long_pass_is_fed_in_chunks_with_the_same_logits(tiny_pair):
    target = tiny_pair.target.lm
    ids = [(i * 7 + 3) % target.vocab_size for i in range(200)]
    whole = target.new_session()
    expected = whole.forward(ids, 3)
    whole.close()
    rec = RecordingLM(target)
    hooks = Hooks()
    with ThreadPoolExecutor(2) as pool:
        guarded = GuardedModel(rec, pool, lambda work: 30.0, hooks, late_error=lambda s: Late(), prefill_chunk=64)
        session = guarded.new_session()
        got = session.forward(ids, 3)
        assert rec.passes == [(64, 0), (64, 0), (64, 0), (8, 3)]  # other calls may run between them
        assert torch.allclose(got, expected, atol=1e-4)
        rec.passes.clear()
        session.forward([5, 6], 2)  # a decode step is one call
        assert rec.passes == [(2, 2)]
        guarded.prefill_chunk = 100
        session2 = guarded.new_session()
        rec.passes.clear()
        session2.forward(ids[:101], 5)  # the last call holds the wanted positions
        assert rec.passes == [(96, 0), (5, 5)]
    assert len(hooks.ok) == 7 and not hooks.late


def test_busy_while_calls_progress_within_their_bound_and_not_once_one_is_stuck():
    gate = threading.Event()
    hooks = Hooks()
    stuck = {"after": 30.0}
    with ThreadPoolExecutor(4) as pool:
        guarded = GuardedModel(GatedDraft(gate), pool, lambda work: 0.05, hooks, late_error=lambda s: Late(),
                               close_async=True, stuck_after=lambda work: stuck["after"])
        assert not guarded.busy()  # nothing in flight
        with pytest.raises(Late):
            guarded.new_session().propose([1, 2], 2, SamplingParams(), None)
        assert guarded.busy()  # late for its use, still within the bound: working
        snap = guarded.snapshot()
        assert snap["in_flight"] == 1 and snap["tokens_in_flight"] == 4 and snap["stuck_calls"] == 0
        stuck["after"] = 0.0
        with pytest.raises(Late):
            guarded.new_session().propose([1, 2], 2, SamplingParams(), None)
        assert not guarded.busy() and guarded.snapshot()["stuck_calls"] == 1  # one ran past its bound
        gate.set()
    assert guarded.running == 0 and guarded.last_answer is not None
    assert hooks.late_answers == 2  # the abandoned calls answered after all: alive, not dead
