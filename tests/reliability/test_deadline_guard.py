"""The adaptive draft deadline, and the guarded model that enforces it (real threads, no server)."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from trtspec.serving.deadline import AdaptiveDeadline
from trtspec.serving.guard import GuardedModel
from trtspec.spec import FixedDraftLength, GenerationRequest, SpeculativeDecoder, StopCriteria
from trtspec.spec.types import Proposal, SamplingParams


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
    assert d.deadline_s(ahead=2) == pytest.approx(0.6)  # two calls to wait for, then its own
    assert d.deadline_s(ahead=7) == 1.0  # the ceiling still holds
    assert AdaptiveDeadline(fixed_s=0.3).deadline_s(ahead=5) == 0.3  # a fixed deadline is fixed


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
        self.late: list[tuple[int, float]] = []
        self.errors: list[tuple[int, BaseException]] = []
        self.error_seen = threading.Event()

    def on_ok(self, seconds: float) -> None:
        self.ok.append(seconds)

    def on_late(self, k: int, deadline_s: float) -> None:
        self.late.append((k, deadline_s))

    def on_error(self, k: int, error: BaseException, started_at: float) -> None:
        self.errors.append((k, error))
        self.error_seen.set()


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

    def propose(self, token_ids, k, sampling, seed):
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
    guarded = GuardedModel(draft, pool, lambda ahead: 0.05, hooks, late_error=lambda s: Late(f"late after {s}s"),
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
    guarded = GuardedModel(draft, pool, lambda ahead: 0.05, hooks, late_error=lambda s: Late("late"), close_async=True)
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
        ok = GuardedModel(GatedDraft(gate), pool, lambda ahead: 5.0, hooks, late_error=lambda s: Late())
        ok.new_session().propose([1, 2], 3, SamplingParams(), None)
        assert len(hooks.ok) == 1 and 0 <= hooks.ok[0] < 5.0
        bad = GuardedModel(GatedDraft(gate, fail=ValueError("boom")), pool, lambda ahead: None, hooks, late_error=lambda s: Late())
        with pytest.raises(ValueError):
            bad.new_session().propose([1, 2], 2, SamplingParams(), None)  # no deadline: inline, same reporting
    assert [(k, str(e)) for k, e in hooks.errors] == [(2, "boom")]


def test_the_guard_counts_running_calls_for_the_deadline_and_measures_one_calls_time():
    gate = threading.Event()
    hooks = Hooks()
    asked: list[int] = []

    def deadline(ahead: int) -> float:
        asked.append(ahead)
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
    assert asked == [0, 1]  # the second call was made with one running ahead of it
    assert guarded.running == 0
    second = min(hooks.ok)  # the first call waited longer and is measured whole; the second is halved
    assert wall >= 0.29 and 0.4 * wall <= second <= 0.5 * wall + 1e-3
