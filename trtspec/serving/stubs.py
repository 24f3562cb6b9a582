"""The Python-backend stub processes of a running server, from ``/proc`` (Linux).

Triton starts one ``triton_python_backend_stub`` process per model instance;
its command line names the model's ``model.py`` (``<repo>/<model>/<version>/model.py``).
Chaos runs and tests find a model's stub here and ``kill -9`` it, which is
what a crashed stub looks like to Triton.
"""

from __future__ import annotations

import os
import platform
import signal
import time
from collections import defaultdict
from pathlib import Path

STUB_NAME = "triton_python_backend_stub"


def _stat_fields(pid: int | str) -> list[str]:
    """``/proc/PID/stat`` after the command name: state, ppid, ...; [] when the process is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return []
    return stat[stat.rfind(")") + 2 :].split()  # "pid (comm) state ppid ..."


def _children() -> dict[int, list[int]]:
    children: dict[int, list[int]] = defaultdict(list)
    for entry in os.scandir("/proc"):
        if entry.name.isdigit() and len(rest := _stat_fields(entry.name)) >= 2:
            children[int(rest[1])].append(int(entry.name))
    return children


def descendants(pid: int) -> list[int]:
    """``pid``'s descendants (not ``pid`` itself)."""
    children = _children()
    out, todo = [], list(children.get(pid, []))
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, []))
    return out


def stub_pids(server_pid: int) -> dict[str, list[int]]:
    """Model name -> PIDs of the stubs under ``server_pid`` serving it."""
    found: dict[str, list[int]] = defaultdict(list)
    for pid in descendants(server_pid):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if not argv or not argv[0].endswith(STUB_NAME.encode()) or len(argv) < 2:
            continue
        model_py = Path(argv[1].decode(errors="replace"))
        if model_py.name == "model.py" and len(model_py.parts) >= 3:
            found[model_py.parent.parent.name].append(pid)
    return dict(found)


def first_stub(server_pid: int, model: str) -> int:
    """The PID of the (first) stub serving ``model``. Raises LookupError when there is none."""
    pids = stub_pids(server_pid).get(model)
    if not pids:
        raise LookupError(f"no stub process for model {model!r} under server pid {server_pid}")
    return pids[0]


def kill_stub(server_pid: int, model: str) -> int:
    """``kill -9`` the (first) stub serving ``model``; its PID. Raises LookupError when there is none."""
    pid = first_stub(server_pid, model)
    os.kill(pid, signal.SIGKILL)
    return pid


# clock_nanosleep and nanosleep, the calls ``time.sleep`` blocks in, by architecture
_SLEEP_SYSCALLS = {"x86_64": {"230", "35"}, "aarch64": {"115", "101"}}


def kill_stub_asleep(server_pid: int, model: str, timeout_s: float = 10.0) -> int:
    """``kill -9`` the (first) stub serving ``model`` at a moment one of its threads sleeps (a
    ``fault_delay_s`` forward pass); its PID. The stub is stopped (SIGSTOP) to look and let go
    (SIGCONT) until then.

    Why: Triton 2.51's Python backend aborts the whole server about 10 s after a stub dies
    holding a lock in the shared memory it shares with the server (``boost::interprocess::
    lock_exception``: docs/reliability.md), which a busy stub killed at a random moment does now
    and then. A kill inside the stub's own work is what our recovery can answer for.
    """
    pid, sleeping = first_stub(server_pid, model), _SLEEP_SYSCALLS.get(platform.machine(), set())
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        os.kill(pid, signal.SIGSTOP)
        while _state(pid) not in ("T", "t", "Z", ""):
            time.sleep(0.0005)  # stopping is asynchronous
        if sleeping & _syscalls(pid):
            os.kill(pid, signal.SIGKILL)
            return pid
        os.kill(pid, signal.SIGCONT)
        time.sleep(0.002)
    raise TimeoutError(f"stub of model {model!r} (pid {pid}) was not seen asleep within {timeout_s:g}s")


def _state(pid: int) -> str:
    fields = _stat_fields(pid)
    return fields[0] if fields else ""


def _syscalls(pid: int) -> set[str]:
    """The system calls ``pid``'s threads are blocked in (numbers, as ``/proc/PID/task/TID/syscall`` gives)."""
    out = set()
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            out.add((task / "syscall").read_text().split()[0])
        except (OSError, IndexError):
            continue
    return out


def alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie."""
    return _state(pid) not in ("", "Z")
