"""The launcher: which tritonserver, the environment it needs, and failures that say why."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from trtspec.serving import launcher
from trtspec.serving.launcher import (
    DEFAULT_OMP_SPINCOUNT,
    MALLOC_ENV,
    OMP_SPIN_ENV,
    ServerError,
    TritonInstall,
    TritonServer,
    find_tritonserver,
    free_port,
    malloc_library,
    python_shared_lib_dir,
)


@pytest.fixture(scope="module")
def install():
    try:
        return find_tritonserver()
    except ServerError as e:
        pytest.skip(str(e))


def test_a_tritonserver_on_path_wins(tmp_path, monkeypatch):
    fake = tmp_path / "bin" / "tritonserver"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}{os.pathsep}{os.environ['PATH']}")
    found = find_tritonserver()
    assert found.source == "PATH" and found.executable == fake and found.make_backend_dir(tmp_path) is None


def test_the_wheel_server_gets_its_libraries_stub_and_our_python(install, tmp_path):
    if install.source != "nvidia-pytriton":
        pytest.skip("tritonserver comes from PATH here")
    env = install.env({"PATH": "/usr/bin", "LD_LIBRARY_PATH": "/opt/x"})
    assert env["PATH"].split(os.pathsep)[0] == str(Path(sys.executable).parent)
    ld = env["LD_LIBRARY_PATH"].split(os.pathsep)
    assert ld[0] == str(install.lib_dir) and ld[-1] == "/opt/x"
    if python_shared_lib_dir() is not None:
        assert str(python_shared_lib_dir()) in ld
    assert env["OMP_WAIT_POLICY"] == "PASSIVE"
    backends = install.make_backend_dir(tmp_path)
    assert sorted(p.name for p in (backends / "python").iterdir()) == [
        "libtriton_python.so", "triton_python_backend_stub", "triton_python_backend_utils.py"]
    assert f"{sys.version_info[0]}.{sys.version_info[1]}" in str(install.stub)


def test_openmp_threads_spin_briefly_then_sleep_unless_the_user_chose():
    install = TritonInstall(executable=Path("/opt/tritonserver/bin/tritonserver"), source="PATH")
    plain = install.env({"PATH": "/usr/bin"}, malloc="system")
    assert plain["OMP_WAIT_POLICY"] == "PASSIVE" and plain["GOMP_SPINCOUNT"] == str(DEFAULT_OMP_SPINCOUNT)
    assert install.env({"PATH": "/usr/bin", OMP_SPIN_ENV: "0"}, malloc="system")["GOMP_SPINCOUNT"] == "0"
    # the user's own OpenMP settings are theirs: nothing added
    active = install.env({"PATH": "/usr/bin", "OMP_WAIT_POLICY": "ACTIVE"}, malloc="system")
    assert active["OMP_WAIT_POLICY"] == "ACTIVE" and "GOMP_SPINCOUNT" not in active
    spin = install.env({"PATH": "/usr/bin", "GOMP_SPINCOUNT": "5000"}, malloc="system")
    assert spin["GOMP_SPINCOUNT"] == "5000" and "OMP_WAIT_POLICY" not in spin
    with pytest.raises(ServerError, match=OMP_SPIN_ENV):
        install.env({"PATH": "/usr/bin", OMP_SPIN_ENV: "fast"}, malloc="system")


def test_free_ports_are_free():
    import socket

    port = free_port()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))


def _repo_with(tmp_path: Path, body: str, name: str = "broken") -> Path:
    model = tmp_path / "repo" / name
    (model / "1").mkdir(parents=True)
    (model / "config.pbtxt").write_text(textwrap.dedent(f"""\
        name: "{name}"
        backend: "python"
        max_batch_size: 0
        input [ {{ name: "x" data_type: TYPE_INT32 dims: [ 1 ] }} ]
        output [ {{ name: "y" data_type: TYPE_INT32 dims: [ 1 ] }} ]
        """))
    (model / "1" / "model.py").write_text(textwrap.dedent(body))
    return tmp_path / "repo"


def test_a_model_that_fails_to_load_is_a_clear_error_and_leaves_no_process(install, tmp_path):
    repo = _repo_with(tmp_path, """\
        class TritonPythonModel:
            def initialize(self, args):
                raise RuntimeError("checkpoint /models/x is corrupt")
        """)
    server = TritonServer(repo, install=install, log_file=tmp_path / "log.txt")
    with pytest.raises(ServerError, match="tritonserver exited with code 1 while starting") as e:
        server.start()
    assert "checkpoint /models/x is corrupt" in str(e.value) and str(tmp_path / "log.txt") in str(e.value)
    assert server.pid is None and not server.alive()


def test_a_server_not_ready_in_time_is_stopped(install, tmp_path):
    repo = _repo_with(tmp_path, """\
        import threading
        class TritonPythonModel:
            def initialize(self, args):
                threading.Event().wait(120)  # a load that takes far too long
        """)
    server = TritonServer(repo, install=install, startup_timeout_s=3)
    with pytest.raises(ServerError, match="not ready after 3s"):
        server.start()
    assert not server.alive()


def test_a_missing_repository_is_refused(tmp_path):
    with pytest.raises(ServerError, match="model repository not found"):
        TritonServer(tmp_path / "nothing").start()


def test_the_allocator_is_chosen_and_preloaded(install):
    jemalloc = malloc_library("jemalloc")  # scripts/ci_setup.sh installs libjemalloc2
    assert jemalloc is not None and "jemalloc" in jemalloc
    assert malloc_library("auto") == jemalloc and malloc_library("system") is None
    env = install.env({"PATH": "/usr/bin", "LD_PRELOAD": "libmine.so"}, malloc="auto")
    assert env["LD_PRELOAD"].split() == [jemalloc, "libmine.so"]
    assert "LD_PRELOAD" not in install.env({"PATH": "/usr/bin", MALLOC_ENV: "system"})
    assert install.env({"PATH": "/usr/bin", MALLOC_ENV: "jemalloc"})["LD_PRELOAD"] == jemalloc
    with pytest.raises(ServerError, match="malloc must be one of auto, system, jemalloc, tcmalloc; got 'hoard'"):
        install.env({"PATH": "/usr/bin"}, malloc="hoard")


def test_the_running_server_uses_the_preloaded_allocator(triton):
    # the shared server (tests/conftest.py) starts with the default: auto
    maps = Path(f"/proc/{triton.pid}/maps").read_text()
    assert "libjemalloc" in maps


def test_an_abort_we_know_is_named_from_the_log(tmp_path):
    """Triton 2.51's abort after a stub died holding a shared-memory lock (docs/reliability.md,
    "A stub killed mid-call"), as its log ends, is named; a log without it names nothing."""
    log = tmp_path / "tritonserver.log"
    server = TritonServer(tmp_path, log_file=log)
    assert server.known_abort() is None  # no log yet
    log.write_text(textwrap.dedent("""\
        I1204 10:00:01.000000 4242 server.cc:674] "successfully loaded 'draft'"
        I1204 10:00:12.000000 4242 model_lifecycle.cc:473] "loading: draft:1"
        """))
    assert server.known_abort() is None
    with log.open("a") as f:
        f.write("terminate called after throwing an instance of 'boost::interprocess::lock_exception'\n"
                "  what():  boost::interprocess::lock_exception\n"
                "Signal (6) received.\n")
    why = server.known_abort()
    assert why is not None and "#8882" in why and "stub died holding a lock" in why and "\n" not in why


class _Signalled(Exception):
    pass


def test_a_signal_another_thread_takes_still_ends_wait(tmp_path):
    """The kernel hands a signal sent to ``trtspec serve`` to any of its threads, and Python runs the
    handler on the main thread only when that thread next runs Python code: ``wait()`` (what the
    main thread does while serving) must return to Python often, or SIGTERM never starts the drain
    (it did not, once in four loaded runs of tests/reliability/test_drain.py: one blocking waitpid)."""
    server = TritonServer(tmp_path)
    server._proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(20)"])

    def handler(*_: object) -> None:
        raise _Signalled

    def signal_this_thread() -> None:
        time.sleep(0.3)  # the main thread is in wait() by then
        signal.pthread_kill(threading.get_ident(), signal.SIGUSR1)

    previous = signal.signal(signal.SIGUSR1, handler)
    t0 = time.monotonic()
    try:
        threading.Thread(target=signal_this_thread).start()
        with pytest.raises(_Signalled):
            server.wait()
        assert time.monotonic() - t0 < 5.0  # the handler ran at once, not when the process ended (20 s)
    finally:
        signal.signal(signal.SIGUSR1, previous)
        server._proc.kill()
        server._proc.wait()


@pytest.mark.parametrize("which", [0, 1, 2], ids=["http", "grpc", "metrics"])
def test_a_picked_port_taken_before_the_server_binds_it_is_picked_again(install, tmp_path, monkeypatch, which):
    """A port picked free can be taken before tritonserver binds it (another process between the pick and
    the bind): the start reads the clash from the server's log and tries again on fresh picks."""
    repo = _repo_with(tmp_path, """\
        class TritonPythonModel:
            def execute(self, requests):
                return []
        """, name="idle")
    picks: list[list[int]] = []
    real_free_ports = launcher.free_ports

    def first_pick_taken(n: int, host: str = "127.0.0.1") -> list[int]:
        ports = real_free_ports(n, host)
        if not picks:
            ports[which] = taken.getsockname()[1]
        picks.append(ports)
        return ports

    monkeypatch.setattr(launcher, "free_ports", first_pick_taken)
    server = TritonServer(repo, install=install, log_file=tmp_path / "log.txt")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        try:
            endpoints = server.start()
            used = (endpoints.http_port, endpoints.grpc_port, endpoints.metrics_port)
            assert len(picks) == 2 and list(used) == picks[1] and taken.getsockname()[1] not in used
            assert server.alive()
        finally:
            server.stop()


@pytest.mark.parametrize("service", ["HTTP", "GRPC", "Metrics"])
def test_a_port_taken_is_one_clear_line_and_no_server_left(install, tmp_path, service):
    """A port given and taken: the start fails with Triton's reason in one line, naming the port, and
    leaves no process. For metrics Triton itself goes on without the service (it exits for HTTP and
    gRPC): a server without metrics would have been served as if it had them."""
    repo = _repo_with(tmp_path, """\
        class TritonPythonModel:
            def execute(self, requests):
                return []
        """, name="idle")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        ports = {"http_port": 0, "grpc_port": 0, "metrics_port": 0, f"{service.lower()}_port": port}
        server = TritonServer(repo, install=install, log_file=tmp_path / "log.txt", **ports)
        with pytest.raises(ServerError, match=rf"failed to start {service} service: .*127.0.0.1:{port}' already in use") as e:
            server.start()
    assert "\n" not in str(e.value) and server.pid is None and not server.alive()
