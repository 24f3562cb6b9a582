"""Admission: a cap on concurrently speculating requests, by priority; never waits."""

from __future__ import annotations

import threading

import pytest

from trtspec.control import Admission, Priority
from trtspec.control.config import AdmissionConfig


def test_cap_then_release() -> None:
    a = Admission(AdmissionConfig(max_speculating=2, soft_max_speculating=1))
    assert a.try_acquire(Priority.NORMAL)
    assert a.try_acquire(Priority.NORMAL)
    assert not a.try_acquire(Priority.NORMAL)  # over the cap: at once, no waiting
    assert a.active == 2
    a.release()
    assert a.try_acquire(Priority.NORMAL)


def test_low_priority_leaves_headroom() -> None:
    a = Admission(AdmissionConfig(max_speculating=4, soft_max_speculating=2))  # low share 0.5
    assert a.try_acquire(Priority.LOW) and a.try_acquire(Priority.LOW)
    assert not a.try_acquire(Priority.LOW)  # low may hold at most floor(4 * 0.5) = 2 slots
    assert a.try_acquire(Priority.NORMAL) and a.try_acquire(Priority.HIGH)
    assert not a.try_acquire(Priority.HIGH)


def test_soft_cap_while_degraded() -> None:
    a = Admission(AdmissionConfig(max_speculating=8, soft_max_speculating=2))
    assert a.limit(Priority.NORMAL, degraded=True) == 2
    assert a.try_acquire(Priority.NORMAL, degraded=True) and a.try_acquire(Priority.NORMAL, degraded=True)
    assert not a.try_acquire(Priority.NORMAL, degraded=True)
    assert a.try_acquire(Priority.NORMAL, degraded=False)  # the full cap applies again when closed


def test_release_without_acquire_is_a_bug() -> None:
    with pytest.raises(AssertionError):
        Admission(AdmissionConfig()).release()


def test_never_more_than_the_cap_from_many_threads() -> None:
    a = Admission(AdmissionConfig(max_speculating=5, soft_max_speculating=1))
    peak = 0
    lock = threading.Lock()
    start = threading.Barrier(8)

    def worker() -> None:
        nonlocal peak
        start.wait()
        for _ in range(2000):
            if a.try_acquire(Priority.NORMAL):
                with lock:
                    peak = max(peak, a.active)
                a.release()

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert a.active == 0
    assert 1 <= peak <= 5
