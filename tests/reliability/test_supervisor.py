"""The supervisor's state machine with a fake clock and scripted reload/probe actions."""

from __future__ import annotations

import threading

import pytest

from trtspec.control import FakeClock
from trtspec.serving.supervisor import Action, Health, ModelSupervisor, SupervisorConfig, SupervisorThread

CFG = SupervisorConfig(backoff_initial_s=1.0, backoff_factor=2.0, backoff_max_s=8.0, health_interval_s=5.0)


class Script:
    """Reload and probe actions that succeed or fail as scripted; they record the clock at each call."""

    def __init__(self, clock: FakeClock, reloads: list[bool] = (), probes: list[bool] = ()) -> None:
        self.clock = clock
        self.reloads = list(reloads)
        self.probes = list(probes)
        self.calls: list[tuple[str, float]] = []

    def reload(self) -> None:
        self.calls.append(("reload", self.clock.now))
        if not self.reloads.pop(0):
            raise RuntimeError("load failed\nsecond line")

    def probe(self) -> None:
        self.calls.append(("probe", self.clock.now))
        if not self.probes.pop(0):
            raise RuntimeError("Stub process 'draft_0_0' is not healthy.")


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(start=100.0)


def make(clock: FakeClock, **kw) -> tuple[ModelSupervisor, list]:
    seen: list = []
    sup = ModelSupervisor("draft", CFG, clock, listeners=[lambda m, old, new, why: seen.append((old, new))], **kw)
    return sup, seen


def test_backoff_schedule():
    assert [CFG.backoff_s(n) for n in range(6)] == [0.0, 1.0, 2.0, 4.0, 8.0, 8.0]  # first attempt at once, capped


def test_an_error_then_a_good_probe_is_a_false_alarm_without_reload(clock):
    sup, seen = make(clock)
    assert sup.report_error("one bad call") is True
    assert sup.state is Health.SUSPECT and not sup.healthy
    assert sup.report_error("another") is False  # already suspect: no second transition
    script = Script(clock, probes=[True])
    sup.step(script.reload, script.probe)
    assert [c for c, _ in script.calls] == ["probe"]  # no reload for a model that answers
    assert sup.state is Health.HEALTHY and seen == [(Health.HEALTHY, Health.SUSPECT), (Health.SUSPECT, Health.HEALTHY)]
    assert sup.snapshot()["outages"] == 0  # a false alarm is not an outage


def test_dead_model_is_reloaded_at_once_then_probed(clock):
    sup, seen = make(clock)
    sup.report_error("Stub process 'draft_0_0' is not healthy.")
    script = Script(clock, reloads=[True], probes=[False, True])  # the check fails, the reload works
    wait = sup.step(script.reload, script.probe)
    assert [c for c, _ in script.calls] == ["probe", "reload", "probe"]
    assert sup.state is Health.HEALTHY and wait == pytest.approx(CFG.health_interval_s)
    assert [new for _, new in seen] == [Health.SUSPECT, Health.FAILED, Health.RELOADING, Health.PROBING, Health.HEALTHY]
    snap = sup.snapshot()
    assert snap["reloads"] == 1 and snap["outages"] == 1 and snap["last_outage"]["reloads"] == 1


def test_failing_reloads_back_off_exponentially_then_recover(clock):
    sup, _ = make(clock)
    sup.report_error("dead")
    # probe (fails) -> reload fails, reload fails, reload ok but its probe fails, reload ok + probe ok
    script = Script(clock, reloads=[False, False, True, True], probes=[False, False, True])
    started = clock.now
    for _ in range(50):  # drive it as the thread would: step, then wait what it says
        wait = sup.step(script.reload, script.probe)
        if sup.healthy:
            break
        assert wait > 0
        clock.advance(wait)
    reload_times = [t - started for c, t in script.calls if c == "reload"]
    assert reload_times == [0.0, 1.0, 3.0, 7.0]  # waits 0, 1, 2, 4 (doubling after each failed attempt)
    assert sup.healthy
    snap = sup.snapshot()
    assert snap["reload_failures"] == 2 and snap["reloads"] == 2 and snap["failed_attempts"] == 0  # reset
    assert snap["last_outage"]["downtime_s"] == pytest.approx(7.0) and snap["last_outage"]["reloads"] == 4


def test_backoff_is_capped(clock):
    sup, _ = make(clock)
    sup.report_error("dead")
    script = Script(clock, reloads=[False] * 8, probes=[False])
    gaps = []
    for _ in range(8):
        wait = sup.step(script.reload, script.probe)
        gaps.append(wait)
        clock.advance(wait)
    assert gaps[:6] == [1.0, 2.0, 4.0, 8.0, 8.0, 8.0]
    assert sup.snapshot()["next_attempt_in_s"] == pytest.approx(0.0)


def test_idle_healthy_model_gets_a_liveness_probe(clock):
    sup, _ = make(clock)
    script = Script(clock, reloads=[True], probes=[True, False, True])
    assert sup.due() == (None, pytest.approx(5.0))
    clock.advance(4.0)
    sup.report_ok()  # traffic proves liveness: the probe moves out
    clock.advance(4.0)
    assert sup.due()[0] is None
    clock.advance(1.0)
    assert sup.due()[0] is Action.PROBE
    sup.step(script.reload, script.probe)  # answers
    assert sup.healthy and [c for c, _ in script.calls] == ["probe"]
    clock.advance(5.0)
    sup.step(script.reload, script.probe)  # the next liveness probe fails: reload at once, probe
    assert [c for c, _ in script.calls] == ["probe", "probe", "reload", "probe"] and sup.healthy


def test_without_a_reload_action_a_failed_model_is_reprobed_on_the_same_schedule(clock):
    sup, _ = make(clock, can_reload=False)
    sup.report_error("dead")
    script = Script(clock, probes=[False, False, False, True])
    for _ in range(10):
        wait = sup.step(None, script.probe)
        if sup.healthy:
            break
        clock.advance(wait)
    assert [c for c, _ in script.calls] == ["probe"] * 4 and sup.healthy
    assert [t - 100.0 for _, t in script.calls] == [0.0, 0.0, 1.0, 3.0]


def test_messages_are_one_line_and_errors_during_recovery_only_update_the_message(clock):
    sup, seen = make(clock)
    sup.report_error("first")
    script = Script(clock, reloads=[False], probes=[False])
    sup.step(script.reload, script.probe, max_actions=2)
    assert sup.state is Health.FAILED and sup.last_error == "reload failed: load failed"
    n = len(seen)
    sup.report_error("a late request failing too")
    assert sup.state is Health.FAILED and len(seen) == n and sup.last_error == "a late request failing too"


def test_a_failing_listener_does_not_break_the_machine(clock):
    def boom(*_):
        raise RuntimeError("listener bug")

    sup = ModelSupervisor("target", CFG, clock, listeners=[boom])
    sup.report_error("x")
    assert sup.state is Health.SUSPECT


def test_thread_runs_steps_and_wakes_on_an_error():
    """The real thread with the real clock: an error wakes it; polled with a deadline."""
    probed = threading.Event()
    sup = ModelSupervisor("draft", SupervisorConfig(health_interval_s=0))
    t = SupervisorThread(sup, reload=lambda: None, probe=probed.set, max_wait_s=30.0).start()
    try:
        assert not probed.is_set()
        sup.report_error("boom")
        assert probed.wait(10.0), "the thread did not wake up on report_error"
        deadline = threading.Event()
        for _ in range(200):
            if sup.healthy:
                break
            deadline.wait(0.05)
        assert sup.healthy
    finally:
        t.stop()


def test_a_dead_stub_is_reloaded_without_a_probe_first(clock):
    sup, _ = make(clock)
    assert sup.report_error("Stub process 'draft_0_0' is not healthy.", fatal=True)
    assert sup.state is Health.FAILED and sup.due() == (Action.RELOAD, 0.0)
    script = Script(clock, reloads=[True], probes=[True])
    sup.step(script.reload, script.probe)
    assert [c for c, _ in script.calls] == ["reload", "probe"] and sup.healthy


def test_a_fatal_report_during_the_suspect_probe_abandons_it_and_reloads_at_once(clock):
    sup, _ = make(clock)
    sup.report_error("3 draft calls in a row missed their deadline")
    calls = []

    def probe() -> None:  # the slow probe; while it waits, a late call reports the stub dead
        calls.append("probe")
        if len(calls) == 1:
            sup.report_error("Stub process 'draft_0_0' is not healthy.", fatal=True)
            assert sup.abandoned()
            raise RuntimeError("probe abandoned: declared dead meanwhile")

    def reload() -> None:
        calls.append("reload")

    sup.step(reload, probe)
    assert calls == ["probe", "reload", "probe"] and sup.healthy
    assert sup.snapshot()["probe_failures"] == 0  # the abandoned probe is not a failure of its own


def test_errors_of_calls_made_before_the_last_recovery_are_ignored(clock):
    sup, _ = make(clock)
    before = clock.now
    sup.report_error("dead", fatal=True)
    clock.advance(3.0)
    sup.step(Script(clock, reloads=[True]).reload, Script(clock, probes=[True]).probe)
    assert sup.healthy
    # a call abandoned on the old stub fails only now: it must not condemn the new one
    assert sup.report_error("Stub process 'draft_0_0' is not healthy.", fatal=True, started_at=before) is False
    assert sup.healthy
    assert sup.report_error("a fresh failure", started_at=clock.now) is True and sup.state is Health.SUSPECT


# -- busy is not dead ------------------------------------------------------------------


def test_a_busy_healthy_model_gets_no_liveness_probe_its_calls_in_flight_are_the_check(clock):
    busy = [True]
    sup, _ = make(clock, busy=lambda: busy[0])
    script = Script(clock, probes=[True])
    clock.advance(60.0)  # a long prefill: nothing answered for far longer than health_interval_s
    assert sup.due()[0] is None and sup.snapshot()["probe"]["state"] == "waiting"
    sup.step(script.reload, script.probe)
    assert script.calls == [] and sup.healthy
    busy[0] = False  # the call ended (or ran past its bound): now the model is probed
    assert sup.due()[0] is Action.PROBE


def test_a_busy_suspect_model_waits_for_its_calls_and_one_answering_clears_it(clock):
    sup, seen = make(clock, busy=lambda: True)
    sup.report_error("2 calls late")
    script = Script(clock)
    clock.advance(30.0)
    sup.step(script.reload, script.probe)
    assert script.calls == [] and sup.state is Health.SUSPECT  # no probe queued behind the work
    sup.report_ok()  # one of them answered: alive
    assert sup.healthy and seen[-1] == (Health.SUSPECT, Health.HEALTHY) and sup.reloads == 0


def test_a_probe_that_queued_behind_a_call_made_after_it_gives_no_verdict(clock):
    busy = [False]
    sup, seen = make(clock, busy=lambda: busy[0])
    clock.advance(10.0)  # idle past health_interval_s: a liveness probe is due

    def probe_behind_a_long_prefill() -> None:
        busy[0] = True  # a request's long prefill reached the model just before the probe
        clock.advance(CFG.health_interval_s)
        raise TimeoutError("model 'target' did not answer a probe within 0.3s")

    sup.step(None, probe_behind_a_long_prefill, max_actions=1)
    assert sup.healthy and seen == [] and sup.probe_failures == 0
    assert sup.snapshot()["probes_inconclusive"] == 1
    assert sup.due()[0] is None  # the prefill is the liveness check now
    busy[0] = False  # it ended without answering (or ran past its bound): probed again
    assert sup.due()[0] is Action.PROBE
    script = Script(clock, probes=[False])
    sup.step(None, script.probe, max_actions=1)  # an idle model failing its probe is FAILED, as before
    assert sup.state is Health.FAILED and sup.probe_failures == 1


def test_no_reload_under_progressing_calls_unless_the_stub_is_dead(clock):
    busy = [False]
    sup, _ = make(clock, busy=lambda: busy[0])
    script = Script(clock, reloads=[True, True], probes=[False, True, True])
    sup.report_error("a call failed")
    sup.step(script.reload, script.probe, max_actions=1)  # the probe fails: FAILED
    assert sup.state is Health.FAILED
    busy[0] = True  # requests started meanwhile and progress
    assert sup.due()[0] is None
    sup.step(script.reload, script.probe)
    assert [c for c, _ in script.calls] == ["probe"] and sup.state is Health.FAILED
    sup2, _ = make(clock, busy=lambda: True)
    sup2.report_error("Stub process 'draft_0_0' is not healthy.", fatal=True)
    assert sup2.due()[0] is Action.RELOAD  # Triton says dead: its calls in flight fail anyway


def test_the_snapshot_says_what_the_probe_did(clock):
    sup, _ = make(clock)
    clock.advance(5.0)

    def probe() -> None:
        clock.advance(0.25)

    sup.step(None, probe, max_actions=1)
    p = sup.snapshot()["probe"]
    assert p["state"] == "idle" and p["last_ok"] is True and p["last_seconds"] == pytest.approx(0.25)
