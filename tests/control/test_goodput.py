"""The goodput controller: its rule, its cost model, and its behaviour on scripted sequences."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pytest

from trtspec.control.config import GoodputConfig
from trtspec.control.goodput import (
    RESUME_MIN_EVIDENCE,
    CostModel,
    GoodputController,
    GoodputModel,
    best_k,
    expected_emitted,
)
from trtspec.decoding.types import IterationOutcome

D = 0.010  # seconds per draft token in the scripted runs
V0 = 0.050  # a plain target step


def verify_s(k: int) -> float:
    return V0 + 0.004 * k


def outcome(k: int, accepted: int, d: float = D, v: Callable[[int], float] = verify_s) -> IterationOutcome:
    return IterationOutcome(k, accepted, accepted + 1, k > 0 and accepted == k, 100, d * k, v(k))


def run_request(
    model: GoodputModel,
    accept: Callable[[int], int],
    iterations: int,
    config: GoodputConfig | None = None,
    k_max: int = 8,
    max_new_tokens: int = 0,
    catchup_s_per_token: float = 0.0,
) -> list[int]:
    """One request of ``iterations`` iterations after its prefill, in the loop's order: the
    prefill (k = 0, never asked for, observed, slow: the whole prompt), then next_k/observe;
    ``accept(k)`` says how many of k drafts are accepted. The request's first draft
    takes ``catchup_s_per_token`` longer per context token (the draft reads the prompt)."""
    c = GoodputController(model, k_max, config or model.config, max_new_tokens=max_new_tokens)
    c.observe(outcome(0, 0, v=lambda _k: 20 * V0))
    ks = []
    for _ in range(iterations):
        k = c.next_k()
        ks.append(k)
        o = outcome(k, min(k, accept(k)))
        if k > 0 and not any(ks[:-1]):
            # one pass over the context yields the first draft token, then k - 1 drafting steps
            o = dataclasses.replace(o, draft_time_s=catchup_s_per_token * o.context_len + (k - 1) * D)
        c.observe(o)
    c.finish()
    return ks


def good(k: int) -> int:
    return k


def useless(k: int) -> int:
    return 0


# -- the rule --------------------------------------------------------------------


@pytest.mark.parametrize("alpha", [0.0, 0.3, 0.8, 0.95])
@pytest.mark.parametrize("k", [0, 1, 4, 8])
def test_expected_emitted_is_leviathans_closed_form_for_iid_acceptance(alpha: float, k: int) -> None:
    closed = (1 - alpha ** (k + 1)) / (1 - alpha)  # Leviathan et al. 2023, Eq. (1)
    assert expected_emitted([alpha] * 8, k) == pytest.approx(closed)


@pytest.mark.parametrize(("alpha", "c"), [(0.9, 0.05), (0.8, 0.1), (0.6, 0.2), (0.95, 0.02), (0.7, 0.4)])
def test_best_k_is_the_papers_optimum_with_constant_verify_cost(alpha: float, c: float) -> None:
    # Leviathan Thm 3.8: speedup (1 - a^(k+1)) / ((1 - a)(k c + 1)); verify cost constant (= 1)
    speedup = [(1 - alpha ** (k + 1)) / ((1 - alpha) * (k * c + 1)) for k in range(9)]
    t = [k * c + 1.0 for k in range(9)]
    k, g = best_k([alpha] * 8, t, min_gain=0.0)
    assert k == max(range(9), key=lambda j: speedup[j])
    assert g == pytest.approx(speedup)


def test_nothing_pays_gives_k0() -> None:
    t = [1.0 + 0.3 * k + 0.1 * k for k in range(9)]
    assert best_k([0.1] * 8, t, 0.02)[0] == 0  # a useless draft
    assert best_k([0.99] * 8, [1.0 + 5.0 * k for k in range(9)], 0.02)[0] == 0  # a draft slower than the target


def test_min_gain_keeps_marginal_speculation_off() -> None:
    # k=1 with a=0.12, c=0.1: 1.12 / 1.1 = 1.018 -> 1.8% better than the target alone
    t = [1.0, 1.1]
    assert best_k([0.12], t, 0.0)[0] == 1
    assert best_k([0.12], t, 0.02)[0] == 0


def test_per_position_acceptance_stops_where_the_draft_stops_agreeing() -> None:
    a = [0.97, 0.95, 0.05, 0.9, 0.9, 0.9, 0.9, 0.9]  # position 3 is almost never accepted
    t = [1.0 + 0.1 * k for k in range(9)]
    assert best_k(a, t, 0.02)[0] == 2


# -- the cost model ----------------------------------------------------------------


def test_costs_before_measurement_come_from_the_priors() -> None:
    cfg = GoodputConfig(prior_draft_cost=0.25, prior_verify_cost_per_token=0.1)
    t = CostModel(4, cfg).iteration_times()
    assert t == pytest.approx([1.0, 1.35, 1.7, 2.05, 2.4])


def test_a_stalled_step_does_not_move_the_median() -> None:
    m = CostModel(4, GoodputConfig())
    for s in [0.05, 0.05, 2.0, 0.05, 0.05]:  # one step the OS preempted
        m.observe_verify(0, s)
    assert m.verify_times()[0] == pytest.approx(0.05)


def test_one_sample_does_not_replace_the_prior() -> None:
    m = CostModel(4, GoodputConfig(prior_draft_cost=0.25))
    for _ in range(3):
        m.observe_verify(0, 0.05)
    m.observe_draft(1.0)  # the first draft step after start-up: a stall
    assert m.iteration_times()[1] == pytest.approx(0.25 * 0.05 + m.verify_times()[1])


def test_unmeasured_verify_cost_is_guessed_optimistically() -> None:
    m = CostModel(8, GoodputConfig())
    for _ in range(5):
        m.observe_verify(0, 0.040)
        m.observe_verify(2, 0.060)
        m.observe_verify(6, 0.100)
    v = m.verify_times()
    assert v[0] == pytest.approx(0.040)
    assert v[2] == pytest.approx(0.060) and v[6] == pytest.approx(0.100)  # measured
    assert v[4] == pytest.approx(0.060)  # as the nearest smaller measured k: try it
    assert v[8] == pytest.approx(0.100)
    assert v[1] == pytest.approx(0.060)  # only larger k measured: no more than the nearest


def test_measured_verify_costs_need_not_grow_with_k() -> None:
    m = CostModel(8, GoodputConfig())
    for _ in range(5):
        m.observe_verify(2, 0.090)
        m.observe_verify(3, 0.070)  # real kernels: 4 tokens in one pass can be cheaper than 3
    v = m.verify_times()
    assert (v[2], v[3]) == (pytest.approx(0.090), pytest.approx(0.070))
    assert v[0] == pytest.approx(0.090 / 1.2)  # no target step measured: from the prior ratio


def test_a_cheaper_unmeasured_k_gets_tried_and_kept() -> None:
    """Verify costs that are not smooth in k (v[2] > v[4]) do not trap the controller at a small k."""
    costs = {0: 0.045, 1: 0.080, 2: 0.100, 3: 0.075, 4: 0.080, 5: 0.095, 6: 0.107, 7: 0.107, 8: 0.105}
    model = GoodputModel(8, GoodputConfig(prior_draft_cost=0.4))
    c = GoodputController(model, 8, model.config)
    ks = []
    for _ in range(150):
        k = c.next_k()
        ks.append(k)
        c.observe(IterationOutcome(k, k if k < 5 else 4, min(k, 4) + 1, k < 5, 100, 0.018 * k, costs[k]))
    tail = ks[-50:]
    assert max(set(tail), key=tail.count) == 4  # the best: 5 tokens in 0.152 s


# -- the controller on scripted sequences ----------------------------------------------


def test_good_draft_drafts_long() -> None:
    model = GoodputModel(8, GoodputConfig())
    ks = run_request(model, good, 60)
    assert ks[0] > 0  # the priors say speculation pays
    steady = ks[30:]  # after the target step is measured (every 8th iteration explores until then)
    assert sum(k == 8 for k in steady) / len(steady) > 0.9


def test_useless_draft_goes_to_target_alone_and_explores_little() -> None:
    model = GoodputModel(8, GoodputConfig(probe_share=0.1))
    first = run_request(model, useless, 40)
    assert sum(k > 0 for k in first[-30:]) <= 1
    requests = [run_request(model, useless, 48) for _ in range(20)]
    later = [k for ks in requests for k in ks]
    share = sum(k > 0 for k in later) / len(later)
    assert 0 < share <= 0.01  # exploration goes on: some new requests still probe...
    assert all(k == 0 for ks in requests for k in ks[1:])  # ...at their first iteration only


def test_first_iteration_timings_are_left_out() -> None:
    model = GoodputModel(8, GoodputConfig())
    c = GoodputController(model, 8, model.config)
    c.next_k()
    c.observe(IterationOutcome(2, 2, 3, True, 40, 5.0, 9.0))  # includes both prefills
    assert all(r.n == 0 for r in model.costs.verify) and model.costs.draft.n == 0
    c.next_k()
    c.observe(IterationOutcome(2, 2, 3, True, 43, 0.02, 0.06))
    assert model.costs.verify[2].n == 1 and model.costs.draft.n == 1


def test_draft_time_after_a_target_only_step_is_left_out() -> None:
    model = GoodputModel(8, GoodputConfig())
    c = GoodputController(model, 8, model.config)
    for k in (3, 0, 3):  # the second k=3 draft catches up on two tokens
        c.observe(outcome(k, k))
    assert model.costs.draft.n == 0
    c.observe(outcome(3, 3))
    assert model.costs.draft.n == 1


def test_exploration_measures_the_target_step_first_then_neighbours() -> None:
    model = GoodputModel(8, GoodputConfig(explore_share=0.05))
    ks = run_request(model, lambda k: min(k, 4), 300)  # the draft agrees for 4 tokens, then never
    assert 0 in ks[:20]  # the baseline gets measured early
    assert model.costs.verify[0].n >= 3
    counts = {k: ks.count(k) for k in set(ks)}
    assert max(counts, key=lambda k: counts[k]) in (4, 5)
    explored = [k for k in counts if k not in (4, 5)]
    assert len(explored) >= 3  # neighbours and far k are measured too
    assert sum(counts[k] for k in explored) / len(ks) < 0.1


def test_a_bad_request_among_good_ones_stops_drafting_at_once() -> None:
    model = GoodputModel(8, GoodputConfig(explore_share=0.0))
    for _ in range(10):
        run_request(model, good, 30)
    ks = run_request(model, useless, 30)
    assert ks[0] > 0  # everybody else speculates well
    assert sum(k > 0 for k in ks) <= 3


def test_a_good_request_among_bad_ones_is_found_when_requests_differ() -> None:
    model = GoodputModel(8, GoodputConfig(explore_share=0.0))
    probe = GoodputController(model, 8, model.config)
    for _ in range(40):  # recent drafting went badly: on average nothing pays now...
        probe.observe(outcome(1, 0))
    for i in range(10):  # ...but among recent requests, some had a draft that agreed well
        if i % 4 == 0:
            model.request_finished(accepted=16, tested=16)
        else:
            model.request_finished(accepted=0, tested=2)
    assert model.estimate(0, 0).k_best == 0
    assert model.requests_differ()
    ks = run_request(model, good, 30)
    assert ks[0] == model.config.probe_k  # this one may be a good one: probe
    assert sum(k >= 4 for k in ks[5:]) / len(ks[5:]) > 0.8  # it was: it speculates


def test_the_drafts_read_of_the_context_is_measured_at_first_drafts() -> None:
    model = GoodputModel(8, GoodputConfig(explore_share=0.0))
    for _ in range(4):
        run_request(model, good, 10, catchup_s_per_token=0.002)
    assert model.snapshot()["draft_catchup_token_s"] == pytest.approx(0.002, rel=0.05)
    assert model.snapshot()["draft_token_s"] == pytest.approx(D)  # drafting steps are measured apart


def test_after_a_draft_failure_the_next_draft_is_measured_as_a_read_of_the_whole_context() -> None:
    """A late draft restarts in a fresh session: its next draft reads everything again, and its
    time is a catch-up (unmeasured before: neither a steady step nor a first draft)."""
    model = GoodputModel(8, GoodputConfig(explore_share=0.0))
    c = GoodputController(model, 8, model.config)
    c.observe(outcome(0, 0, v=lambda _k: 20 * V0))  # the prefill
    c.observe(dataclasses.replace(outcome(3, 3), draft_time_s=0.002 * 100 + 2 * D))  # the first draft reads
    c.observe(outcome(3, 3))
    assert model.costs.catchup.n == 1
    c.observe(dataclasses.replace(outcome(0, 0), draft_failed=True, drafter="model"))
    c.observe(dataclasses.replace(outcome(3, 3), draft_time_s=0.004 * 100 + 2 * D))
    assert model.costs.catchup.n == 2 and max(model.costs.catchup.samples) == pytest.approx(0.004, rel=0.05)


def test_after_a_draft_failure_resuming_is_weighed_against_reading_everything_again() -> None:
    """Near its end, a request whose draft restarted does not pay a read of its whole context
    for the few tokens left (it would have drafted on, its draft's cache being current)."""
    model = GoodputModel(8, GoodputConfig(explore_share=0.0))
    for _ in range(4):
        run_request(model, good, 10, catchup_s_per_token=0.01)
    c = GoodputController(model, 8, model.config, max_new_tokens=40)
    c.observe(outcome(0, 0, v=lambda _k: 20 * V0))
    for _ in range(3):
        k = c.next_k()
        c.observe(outcome(k, k))
    assert c.next_k() > 0 and c.last_reason == "best"  # 13 tokens left: drafting on pays
    c.observe(dataclasses.replace(outcome(0, 0), draft_failed=True, drafter="model"))
    assert c.next_k() == 0 and c.last_reason == "not_worth_it"  # reading ~110 tokens again does not


def test_expected_remaining_is_the_recent_mean_length_capped_by_max_new_tokens() -> None:
    model = GoodputModel(8, GoodputConfig())
    assert model.expected_remaining(0, 1) == 63  # nothing seen yet: a 64-token request
    for n in (10, 30):
        model.request_finished(accepted=0, tested=0, emitted=n)
    assert model.expected_remaining(0, 1) == 19
    assert model.expected_remaining(8, 1) == 7
    assert model.expected_remaining(0, 40) == 0


def _mixed_population(catchup_s_per_token: float) -> GoodputModel:
    """Recent drafting went badly on average; 3 of the last 10 requests had a draft that agreed;
    the draft read each prompt at ``catchup_s_per_token``."""
    model = GoodputModel(8, GoodputConfig(explore_share=0.0, probe_share=0.0))
    for _ in range(3):  # requests' first drafts (k = 2), to measure the catch-up on a 100-token context
        first_draft = IterationOutcome(2, 0, 1, False, 100, catchup_s_per_token * 100 + D, verify_s(2))
        model.observe(first_draft, first=False, steady_draft=False, catchup_tokens=100)
    probe = GoodputController(model, 8, model.config)
    for _ in range(40):
        probe.observe(outcome(1, 0))
    for i in range(10):
        if i % 4 == 0:
            model.request_finished(accepted=16, tested=16, emitted=64)
        else:
            model.request_finished(accepted=0, tested=2, emitted=64)
    assert model.estimate(0, 0).k_best == 0 and model.requests_differ()
    return model


def test_a_probe_must_pay_for_the_drafts_read_of_the_context() -> None:
    """The chance that a new request is a good one is worth a probe only when what a good
    one saves over the rest of the request outweighs what probing costs every request:
    the draft's read of the context, and a wasted iteration on the bad ones."""
    cheap = 0.002  # 100 context tokens: 0.2 s, four target steps
    assert run_request(_mixed_population(cheap), good, 30, max_new_tokens=64)[0] == 2  # probe
    assert run_request(_mixed_population(cheap), good, 6, max_new_tokens=8)[0] == 0  # too short to pay
    dear = 0.02  # 2 s: 40 target steps
    assert run_request(_mixed_population(dear), good, 30, max_new_tokens=64)[0] == 0
    model = _mixed_population(cheap)
    assert model.probe_value(101, 63, 2) > 0 > model.probe_value(101, 7, 2)
    assert model.probe_value(101, 63, 2) > model.probe_value(500, 63, 2)


def one(k: int) -> int:
    return min(k, 1)  # the first draft token is right, the rest wrong: k = 1 pays, modestly


def test_a_request_drafts_only_when_the_saving_pays_for_the_drafts_read_of_the_prompt() -> None:
    """Drafting one token per iteration saves ~18 ms per token here (5 of 8 target
    steps): over ~60 tokens, about 1.1 s. Reading a 100-token prompt at 2 ms per token
    costs 0.2 s (worth it); at 20 ms per token, 2 s (not: the request stays on the target)."""
    for per_token, drafts in ((0.002, True), (0.02, False)):
        model = GoodputModel(8, GoodputConfig(explore_share=0.0, probe_share=0.0))
        for _ in range(3):  # requests' first drafts measure the read
            first_draft = IterationOutcome(1, 1, 2, True, 100, per_token * 100, verify_s(1))
            model.observe(first_draft, first=False, steady_draft=False, catchup_tokens=100)
        for _ in range(20):  # what drafting does on these requests once the prompt is read
            model.observe(outcome(1, 1), first=False, steady_draft=True)
            model.observe(outcome(2, 1), first=False, steady_draft=True)
        assert model.estimate(0, 0).k_best == 1
        ks = run_request(model, one, 60, max_new_tokens=64)
        assert (ks[0] > 0) is drafts
        assert (sum(k > 0 for k in ks) > 50) is drafts  # and it never starts later either


def test_a_homogeneous_useless_population_does_not_probe_new_requests() -> None:
    model = GoodputModel(8, GoodputConfig(probe_share=0.0))
    for _ in range(10):
        run_request(model, useless, 30)
    assert not model.requests_differ()
    assert run_request(model, useless, 30) == [0] * 30


def test_a_request_on_the_target_alone_does_not_resume_on_priors_alone() -> None:
    model = GoodputModel(8, GoodputConfig(probe_share=0.0, memory_iterations=50))
    run_request(model, useless, 10)
    ks = run_request(model, useless, 1500)  # the evidence fades; the prior (0.7) alone would pay here
    assert sum(k > 0 for k in ks[1:]) == 0  # it does not resume drafting on the priors alone...
    assert model.estimate(0, 0).k_best > 0  # ...though by then the (faded) estimate says drafting pays


def test_a_draft_that_recovers_is_noticed() -> None:
    model = GoodputModel(8, GoodputConfig(probe_share=0.1, memory_iterations=200))
    for _ in range(10):
        run_request(model, useless, 48)
    ks: list[int] = []
    for _ in range(20):  # the draft is good again (a fault cleared)
        ks += run_request(model, good, 48)
    assert sum(k >= 4 for k in ks[-96:]) / 96 > 0.8


def test_snapshot_reports_the_estimates() -> None:
    model = GoodputModel(4, GoodputConfig())
    run_request(model, good, 20, k_max=4)
    snap = model.snapshot()
    assert len(snap["acceptance_per_position"]) == 4
    assert snap["draft_token_s"] == pytest.approx(D)
    assert snap["k_best_now"] == 4
    assert not snap["young"] and GoodputModel(4, GoodputConfig()).snapshot()["young"]


def test_an_unlucky_start_is_corrected_by_sampled_probes() -> None:
    """Three unlucky first drafts make the means say "nothing pays"; thin evidence
    keeps the posterior wide, so new requests still probe and find the draft good."""
    model = GoodputModel(8, GoodputConfig(probe_share=0.0, min_paying_share=0.0, prior_draft_cost=0.4))
    c = GoodputController(model, 8, model.config)
    for k, acc in [(2, 1), (4, 0), (3, 1)]:
        c.observe(outcome(k, acc, d=0.018, v=lambda k: 0.045 if k == 0 else 0.08 + 0.003 * k))
    assert model.estimate(0, 0).k_best == 0
    requests = [run_request(model, good, 20) for _ in range(10)]
    assert any(ks[0] > 0 for ks in requests[:5])  # probes...
    assert sum(k >= 3 for k in requests[-1]) / 20 > 0.8  # ...that put it back to work


def test_sampled_probes_are_rare_once_the_evidence_is_clear() -> None:
    model = GoodputModel(8, GoodputConfig())
    c = GoodputController(model, 8, model.config)
    for _ in range(200):
        c.observe(outcome(1, 0))
    draws = [model.sampled_k() for _ in range(500)]
    assert sum(k > 0 for k in draws) / 500 < 0.02


def unlucky_first_draft() -> Callable[[int], int]:
    """A draft that agrees throughout, except that its first draft is rejected."""
    calls = []

    def accept(k: int) -> int:
        calls.append(k)
        return 0 if len(calls) == 1 else k

    return accept


def test_one_unlucky_rejection_does_not_stop_a_request_for_good() -> None:
    """On a fresh server, one rejection at a request's first draft made the means say nothing
    pays for it, and a resting request only resumed on a change of the means (which its own
    evidence never brings while it rests): it ran on the target alone to its end (seen on the
    demo pair, chat: auto drafted 0 model tokens on 3 of the first 10 requests). A resting
    request redraws its acceptance from its posterior each iteration, which one rejection
    leaves wide: it resumes, and finds the draft good."""
    model = GoodputModel(8, GoodputConfig(explore_share=0.0))
    ks = run_request(model, unlucky_first_draft(), 40)
    assert ks[0] > 0  # the priors say speculation pays: the first draft, rejected
    assert sum(k >= 4 for k in ks[10:]) / 30 > 0.8


def rejected_at(*calls: int) -> Callable[[int], int]:
    """A draft that agrees throughout, except at the given drafts (1-based), rejected at once."""
    n = [0]

    def accept(k: int) -> int:
        n[0] += 1
        return 0 if n[0] in calls else k

    return accept


# The demo pair's costs on a 2-core Zen 4 (``bench_fresh_server.py``'s trace): a draft token
# 0.53 of a target step, so ``k = 1`` pays only above ~0.6 per position.
COSTLY_D = 0.017


def costly_verify_s(k: int) -> float:
    return 0.032 + 0.0005 * k


def run_costly(model: GoodputModel, accept: Callable[[int], int], iterations: int) -> list[int]:
    """``run_request`` with the costly draft (k_max 5)."""
    c = GoodputController(model, 5, model.config)
    c.observe(outcome(0, 0, v=lambda _k: 0.065))  # the prefill
    ks = []
    for _ in range(iterations):
        ks.append(c.next_k())
        c.observe(outcome(ks[-1], min(ks[-1], accept(ks[-1])), d=COSTLY_D, v=costly_verify_s))
    c.finish()
    return ks


def test_a_fresh_server_does_not_believe_an_unlucky_start() -> None:
    """Seen on the demo pair: the first prompt's second and third drafts are rejected, so after four
    drafts the means say nothing pays against a draft at 0.53 of a target step, and the first
    request, then often the next ones, ran on the target alone (0.94x of off). Until
    ``RESUME_MIN_EVIDENCE`` drafts were ever tested, a request drafts ``probe_k`` though the means
    say nothing pays: it finds the draft good, and the requests after it draft long."""
    model = GoodputModel(5, GoodputConfig(probe_share=0.0, explore_share=0.0))
    first = run_costly(model, rejected_at(2, 3), 30)
    assert all(k > 0 for k in first)
    assert sum(k >= 4 for k in first[10:]) / 20 > 0.8
    second = run_costly(model, good, 30)
    assert sum(k >= 4 for k in second) / 30 > 0.8


def test_a_useless_draft_costs_a_fresh_server_a_few_drafts() -> None:
    model = GoodputModel(5, GoodputConfig(probe_share=0.0, explore_share=0.0))
    ks = [k for _ in range(5) for k in run_costly(model, useless, 30)]
    assert 0 < sum(k > 0 for k in ks) <= RESUME_MIN_EVIDENCE + 2


def test_auto_redraws_a_model_stopped_by_one_unlucky_rejection() -> None:
    """The same under ``auto``: a resting model's gain is its redraw's, so it is chosen again
    over a free drafter that finds nothing on chat-like text."""
    models = auto_models()
    picks = run_auto(models, {"suffix": lambda k: 0, "model": unlucky_first_draft()}, 40)
    assert sum(p.startswith("model:") for p in picks[10:]) / 30 > 0.8


def test_positions_never_drafted_are_assumed_like_the_ones_before() -> None:
    model = GoodputModel(8, GoodputConfig(prior_acceptance=0.5))
    c = GoodputController(model, 8, model.config)
    for _ in range(30):
        c.observe(outcome(3, 3))  # only k=3 ever drafted, always fully accepted
    a = model.estimate(0, 0).acceptance
    assert a[0] > 0.9 and a[2] > 0.9
    assert a[3] > 0.9 and a[7] > 0.9  # inherited, not the 0.5 prior
    assert model.estimate(0, 0).k_best > 3  # so longer drafts get tried


def short_request_reasons(model: GoodputModel) -> list[str]:
    """Three iterations of a 3-token request on ``model``, where drafting pays per iteration;
    checks that ``gain`` (what ``auto`` weighs drafters by) is 1.0 whenever ``next_k`` answers 0.
    Returns the reasons ``next_k`` gave."""
    c = GoodputController(model, 8, model.config, max_new_tokens=3)
    c.observe(outcome(0, 0, v=lambda _k: 20 * V0))  # the prefill
    reasons = []
    for _ in range(3):
        assert model.estimate(0, 0).k_best > 0  # drafting pays per iteration
        assert c.gain() == 1.0
        assert c.next_k() == 0
        reasons.append(c.last_reason)
        c.observe(outcome(0, 0))
    return reasons


def test_a_request_that_would_not_start_drafting_gains_nothing() -> None:
    """A short request whose first draft does not pay for the draft's read of its prompt
    (``not_worth_it``), then, where the evidence has faded, waits for measured evidence (``wait``);
    on a fresh model there is nothing to wait for, and the read still does not pay."""
    assert short_request_reasons(GoodputModel(8, GoodputConfig())) == ["not_worth_it"] * 3
    faded = GoodputModel(8, GoodputConfig(memory_iterations=5))
    run_request(faded, good, 10)
    run_request(faded, good, 300, max_new_tokens=3)  # target-only steps: the evidence fades
    assert short_request_reasons(faded) == ["not_worth_it", "wait", "wait"]


# -- auto: the free drafter, the draft model or none ---------------------------------------


def run_auto(models: dict[str, GoodputModel], accept: dict[str, Callable[[int], int]], iterations: int) -> list[str]:
    """One ``auto`` request: each iteration the controller picks a drafter and k; the free drafter
    (``suffix``) drafts in no time, the model in ``D`` per token. Returns ``drafter:k`` per iteration."""
    from trtspec.control.config import DraftLengthConfig, Policy
    from trtspec.control.governor import make_controller
    from trtspec.control.types import RequestInfo
    from trtspec.decoding.types import DrafterKind

    config = DraftLengthConfig(controller="goodput", k_max=8)
    c = make_controller(config, lambda: 0.0, models, RequestInfo(drafter=DrafterKind.AUTO), Policy().drafters.auto_free)
    c.observe(outcome(0, 0, v=lambda _k: 20 * V0))
    picks = []
    for _ in range(iterations):
        name = c.next_drafter(["suffix", "model"])
        k = c.next_k()
        d = 1e-5 if name == "suffix" else D
        o = dataclasses.replace(outcome(k, min(k, accept[name](k)), d=d), drafter=name if k else "")
        c.observe(o)
        picks.append(f"{name}:{k}" if k else "none")
    c.finish()
    return picks


def auto_models() -> dict[str, GoodputModel]:
    return {name: GoodputModel(8, GoodputConfig()) for name in ("suffix", "model")}


def test_auto_drafts_with_the_free_drafter_when_its_drafts_are_right() -> None:
    models = auto_models()
    for _ in range(20):
        picks = run_auto(models, {"suffix": good, "model": good}, 30)
    assert sum(p.startswith("suffix:") for p in picks) >= 25  # free and right: nothing beats it


def test_auto_drafts_with_the_model_when_the_free_drafter_is_wrong() -> None:
    models = auto_models()
    for _ in range(20):
        picks = run_auto(models, {"suffix": lambda k: 0, "model": good}, 30)
    assert sum(p.startswith("model:") for p in picks) >= 25
    assert sum(p.startswith("suffix:") for p in picks) <= 2


def test_auto_probes_the_model_again_after_a_bad_stretch() -> None:
    """Nothing pays, so neither drafter's gain says draft: the model still gets its probe (its
    first decision in a request), so it is found again once it drafts well."""
    models = auto_models()
    for _ in range(3):  # a stretch where every draft is wrong: nothing pays
        run_auto(models, {"suffix": lambda k: 0, "model": lambda k: 0}, 30)
    picks = []
    for _ in range(20):
        picks.append(run_auto(models, {"suffix": lambda k: 0, "model": good}, 30))
    assert all(sum(p.startswith("model:") for p in request) >= 25 for request in picks[-5:])


def test_auto_runs_on_the_target_alone_when_no_drafter_pays() -> None:
    models = auto_models()
    for _ in range(20):
        picks = run_auto(models, {"suffix": lambda k: 0, "model": lambda k: 0}, 30)
    assert picks.count("none") >= 27
