"""Start a real ``tritonserver`` on a model repository, wait for it, stop it cleanly.

Which binary: the ``tritonserver`` on ``PATH`` (NVIDIA's container), else the
one shipped in the ``nvidia-pytriton`` wheel. The wheel's server needs three
things to load Python-backend models (docs/serving.md, "`trtspec serve` and the launcher"):

- the wheel's ``nvidia_pytriton.libs/`` on ``LD_LIBRARY_PATH``;
- a backend directory whose ``python/`` holds ``libtriton_python.so``,
  ``triton_python_backend_utils.py`` and the stub built for THIS Python
  (``python_backend_stubs/3.X/triton_python_backend_stub``) -- we assemble
  one in the server's work directory;
- the running interpreter's ``bin/`` first on ``PATH`` (the stub finds its
  ``python3`` -- and so the installed ``trtspec`` -- through it);
- the running interpreter's ``libpython3.X.so`` found first: the stub loads
  libpython by soname, and with the system's library of another patch release
  (Debian's 3.11.2 under a pyenv 3.11.7 venv) stdlib extensions such as
  ``_ssl`` fail to import ("undefined symbol: _PyModule_Add").

The server runs with ``--model-control-mode=explicit --load-model=*`` so that a
dead model (Triton does not restart a Python stub) can be reloaded through
the repository API. The server's environment carries ``TRTSPEC_STATUS_DIR``
(``<work_dir>/status``), where the models write their status files
(:mod:`trtspec.serving.statusfile`), and ``TRTSPEC_TRITON_URL`` (the server's
own HTTP endpoint on loopback), through which ``spec_decode`` reloads a dead
model: the repository API over HTTP, not ``pb_utils.load_model``, which holds
up every BLS call of the calling stub while the load runs (docs/reliability.md,
"Why we need our own supervisor"). Ports given as 0 are picked free on ``host``. OpenMP
threads spin briefly, then sleep (``OMP_WAIT_POLICY=PASSIVE`` with
``GOMP_SPINCOUNT=30000``, ``$TRTSPEC_OMP_SPINCOUNT`` to change it, nothing when
the user sets either): the three models are processes sharing the same cores
(docs/serving.md, "Threads", has the measurements). The server runs with
jemalloc (else tcmalloc) preloaded where the library is installed, as Triton's
documentation advises (``malloc`` / ``$TRTSPEC_TRITON_MALLOC`` choose): in the soak
the server grew less per request with jemalloc and handed back what a burst took
(figures: docs/reliability.md).
"""

from __future__ import annotations

import contextlib
import ctypes.util
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from trtspec.errors import TrtspecError
from trtspec.serving import drain as draining
from trtspec.serving import statusfile
from trtspec.wire import SPEC_DECODE

DEFAULT_HTTP_PORT = 8000
DEFAULT_GRPC_PORT = 8001
DEFAULT_METRICS_PORT = 8002
TRITON_URL_ENV = "TRTSPEC_TRITON_URL"  # the server's HTTP endpoint, for the models' reloads
MALLOC_ENV = "TRTSPEC_TRITON_MALLOC"  # auto | system | jemalloc | tcmalloc (default auto)
MALLOC_CHOICES = ("auto", "system", "jemalloc", "tcmalloc")
# library names ctypes.util.find_library looks up, in order of preference
_MALLOC_LIBS = {"jemalloc": ("jemalloc",), "tcmalloc": ("tcmalloc_minimal", "tcmalloc")}
# OpenMP threads of the models spin this many rounds before they sleep (libgomp's
# GOMP_SPINCOUNT; its default is 300000, PASSIVE is 0). Unset when the user sets
# OMP_WAIT_POLICY or GOMP_SPINCOUNT for the server.
OMP_SPIN_ENV = "TRTSPEC_OMP_SPINCOUNT"
DEFAULT_OMP_SPINCOUNT = 30000


DRAIN_CUT_WAIT_S = 15.0  # after the grace period, how long requests get to end at their next iteration
_WAIT_STEP_S = 60.0  # wait() without a timeout: Popen.wait(timeout) calls in a row (each one polls)


@dataclass(frozen=True)
class DrainReport:
    """How a drain went (:meth:`TritonServer.drain`)."""

    in_flight_at_start: int  # requests spec_decode had in flight when the drain began
    in_flight_at_end: int  # still in flight when the server was stopped (0 unless something hangs)
    cut: int  # in flight when the grace period ended: ended with a one-line UNAVAILABLE
    refused: int  # new requests refused while draining
    seconds: float

    def to_dict(self) -> dict:
        return {"in_flight_at_start": self.in_flight_at_start, "in_flight_at_end": self.in_flight_at_end,
                "cut": self.cut, "refused": self.refused, "seconds": round(self.seconds, 2)}


class ServerError(TrtspecError):
    """tritonserver is missing, did not start, or died."""


@dataclass(frozen=True)
class TritonInstall:
    """A ``tritonserver`` binary and what it needs to run Python-backend models."""

    executable: Path
    source: str  # "PATH" | "nvidia-pytriton"
    lib_dir: Path | None = None  # prepended to LD_LIBRARY_PATH (wheel only)
    python_backend_dir: Path | None = None  # the wheel's backends/python (stub not inside)
    stub: Path | None = None  # the wheel's stub for this Python version

    def env(self, base: dict[str, str] | None = None, malloc: str | None = None) -> dict[str, str]:
        """The environment the server runs in: our interpreter's bin first on PATH, the wheel's libs,
        the allocator (``malloc``, default ``$TRTSPEC_TRITON_MALLOC`` or auto) preloaded."""
        env = dict(os.environ if base is None else base)
        lib = malloc_library(malloc or env.get(MALLOC_ENV) or "auto")
        if lib is not None:
            pre = env.get("LD_PRELOAD", "")
            if lib not in pre.split():
                env["LD_PRELOAD"] = f"{lib} {pre}".strip()
        py_bin = str(Path(sys.executable).parent)
        env["PATH"] = os.pathsep.join([py_bin, env.get("PATH", "")])
        # The stub links against libpython3.X.so by soname: make it find THIS
        # interpreter's (a pyenv or venv Python's stdlib extensions fail on the
        # system libpython of another patch release: "undefined symbol").
        libs = [str(self.lib_dir)] if self.lib_dir is not None else []
        py_lib = python_shared_lib_dir()
        if py_lib is not None:
            libs.append(str(py_lib))
        if libs:
            ld = env.get("LD_LIBRARY_PATH", "")
            env["LD_LIBRARY_PATH"] = os.pathsep.join([*libs, *([ld] if ld else [])])
        env.setdefault("PYTHONUNBUFFERED", "1")
        # draft, target and spec_decode are separate processes taking turns on
        # the same cores: OpenMP threads must not spin long after a forward pass
        # (libgomp's default spins ~300k rounds), but sleeping at once after
        # every op wakes threads hundreds of times per forward pass: a short
        # spin (docs/serving.md, "Threads", has the measurements).
        if "OMP_WAIT_POLICY" not in env and "GOMP_SPINCOUNT" not in env:
            env["OMP_WAIT_POLICY"] = "PASSIVE"
            env["GOMP_SPINCOUNT"] = omp_spincount(env.get(OMP_SPIN_ENV))
        return env

    def make_backend_dir(self, work_dir: Path) -> Path | None:
        """A backend directory with a Python backend for this interpreter (wheel only; None: server default)."""
        if self.python_backend_dir is None:
            return None
        assert self.stub is not None
        dest = work_dir / "backends" / "python"
        dest.mkdir(parents=True, exist_ok=True)
        for name in ("libtriton_python.so", "triton_python_backend_utils.py"):
            shutil.copy2(self.python_backend_dir / name, dest / name)
        shutil.copy2(self.stub, dest / "triton_python_backend_stub")
        return dest.parent


def omp_spincount(value: str | None) -> str:
    """The server's ``GOMP_SPINCOUNT``: ``value`` (``$TRTSPEC_OMP_SPINCOUNT``) checked, else the default."""
    if value is None or value == "":
        return str(DEFAULT_OMP_SPINCOUNT)
    if not value.isdigit():
        raise ServerError(f"{OMP_SPIN_ENV} must be a whole number of spins (0: sleep at once); got {value!r}")
    return value


def malloc_library(choice: str) -> str | None:
    """The allocator to preload into the server: a library name for ``LD_PRELOAD``, None for glibc's.

    ``auto``: jemalloc, else tcmalloc, else glibc's. Naming one that is not
    installed is an error (Debian: ``libjemalloc2``, ``libtcmalloc-minimal4``).
    """
    if choice not in MALLOC_CHOICES:
        raise ServerError(f"malloc must be one of {', '.join(MALLOC_CHOICES)}; got {choice!r}")
    if choice == "system":
        return None
    for kind in ("jemalloc", "tcmalloc") if choice == "auto" else (choice,):
        for name in _MALLOC_LIBS[kind]:
            lib = ctypes.util.find_library(name)
            if lib:
                return lib
    if choice == "auto":
        return None
    raise ServerError(f"malloc {choice!r}: lib{_MALLOC_LIBS[choice][0]} is not installed "
                      f"(Debian: apt-get install {'libjemalloc2' if choice == 'jemalloc' else 'libtcmalloc-minimal4'})")


def python_shared_lib_dir() -> Path | None:
    """The directory holding this interpreter's ``libpython3.X.so`` (None for a static build)."""
    libdir = sysconfig.get_config_var("LIBDIR")
    soname = sysconfig.get_config_var("INSTSONAME")
    if not libdir or not soname or not sysconfig.get_config_var("Py_ENABLE_SHARED"):
        return None
    return Path(libdir) if (Path(libdir) / soname).is_file() else None


def find_tritonserver() -> TritonInstall:
    """The ``tritonserver`` on PATH, else the one in the ``nvidia-pytriton`` wheel."""
    on_path = shutil.which("tritonserver")
    if on_path:
        return TritonInstall(executable=Path(on_path), source="PATH")
    try:
        import pytriton
    except ImportError:
        raise ServerError(
            "no tritonserver found: none on PATH and the nvidia-pytriton wheel is not installed "
            "(pip install nvidia-pytriton, or run inside NVIDIA's Triton container)"
        ) from None
    root = Path(pytriton.__file__).resolve().parent
    dist = root / "tritonserver"
    exe = dist / "bin" / "tritonserver"
    version = f"{sys.version_info[0]}.{sys.version_info[1]}"
    stub = dist / "python_backend_stubs" / version / "triton_python_backend_stub"
    libs = root.parent / "nvidia_pytriton.libs"
    missing = [p for p in (exe, stub, libs, dist / "backends" / "python" / "libtriton_python.so") if not p.exists()]
    if missing:
        raise ServerError(f"the nvidia-pytriton wheel at {root} lacks {missing[0]} (Python {version} unsupported?)")
    return TritonInstall(
        executable=exe,
        source="nvidia-pytriton",
        lib_dir=libs,
        python_backend_dir=dist / "backends" / "python",
        stub=stub,
    )


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on right now (the OS's pick)."""
    return free_ports(1, host)[0]


def free_ports(n: int, host: str = "127.0.0.1") -> list[int]:
    """``n`` distinct TCP ports nothing listens on right now: all held open while picked (one at a time,
    a port just closed can be picked again)."""
    with contextlib.ExitStack() as stack:
        socks = [stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) for _ in range(n)]
        for s in socks:
            s.bind((host if host != "0.0.0.0" else "", 0))
        return [int(s.getsockname()[1]) for s in socks]


def check_ports_free(host: str, ports: Mapping[str, int]) -> None:
    """Raise :class:`ServerError` naming the option when a port asked for (``ports``: option -> port; 0
    picks one, -1 is none) is taken on ``host`` or asked twice. tritonserver binds its ports only
    after loading every model (minutes for a large one), and the front doors start after it."""
    asked = {option: port for option, port in ports.items() if port > 0}
    seen: dict[int, str] = {}
    for option, port in asked.items():
        if port in seen:
            raise ServerError(f"{seen[port]} and {option} are both {port}")
        seen[port] = option
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    for option, port in asked.items():
        with socket.socket(family, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a port in TIME_WAIT is free to servers
            try:
                s.bind((host, port))
            except OSError as e:
                raise ServerError(f"{option} {port}: cannot listen on {host}:{port}: {e.strerror or e}") from None


def _connect_host(host: str) -> str:
    return "127.0.0.1" if host in ("0.0.0.0", "", "::") else host


@dataclass(frozen=True)
class Endpoints:
    host: str
    http_port: int
    grpc_port: int
    metrics_port: int

    @property
    def http(self) -> str:
        return f"{_connect_host(self.host)}:{self.http_port}"

    @property
    def grpc(self) -> str:
        return f"{_connect_host(self.host)}:{self.grpc_port}"

    @property
    def metrics_url(self) -> str:
        return f"http://{_connect_host(self.host)}:{self.metrics_port}/metrics"

    def to_dict(self, model: str = SPEC_DECODE) -> dict[str, str]:
        """The endpoints; ``generate*`` are ``model``'s (the name spec_decode is served under)."""
        return {
            "http": f"http://{self.http}",
            "grpc": self.grpc,
            "metrics": self.metrics_url,
            "generate": f"http://{self.http}/v2/models/{model}/generate",
            "generate_stream": f"http://{self.http}/v2/models/{model}/generate_stream",
        }


@dataclass
class TritonServer:
    """One ``tritonserver`` process on ``model_repo``. Use as a context manager.

    ``start()`` returns once the server and every model in the repository are
    ready, or raises :class:`ServerError` quoting the last log lines.
    """

    model_repo: Path
    host: str = "127.0.0.1"
    http_port: int = 0  # 0: pick a free port
    grpc_port: int = 0
    metrics_port: int = 0
    log_file: Path | None = None  # default: <work_dir>/tritonserver.log
    work_dir: Path | None = None  # default: a fresh temporary directory, removed on stop
    startup_timeout_s: float = 300.0
    log_verbose: int = 0
    extra_args: Sequence[str] = ()
    install: TritonInstall | None = None
    malloc: str | None = None  # auto | system | jemalloc | tcmalloc; None: $TRTSPEC_TRITON_MALLOC or auto
    _proc: subprocess.Popen | None = field(default=None, init=False, repr=False)
    _own_work_dir: bool = field(default=False, init=False, repr=False)
    _log_handle: object = field(default=None, init=False, repr=False)
    endpoints: Endpoints | None = field(default=None, init=False)

    # -- lifecycle --------------------------------------------------------

    def start(self) -> Endpoints:
        if self._proc is not None:
            raise ServerError("server already started")
        repo = Path(self.model_repo).resolve()
        if not repo.is_dir():
            raise ServerError(f"model repository not found: {repo}")
        install = self.install or find_tritonserver()
        work_dir = self._make_dirs()
        backend_dir = install.make_backend_dir(work_dir)

        # A port picked free can be taken before the server binds it: retry
        # with fresh picks when we chose the ports ourselves.
        picked = 0 in (self.http_port, self.grpc_port, self.metrics_port)
        attempts = 3 if picked else 1
        try:
            for attempt in range(attempts):
                log_start = self._spawn(install, repo, backend_dir)
                try:
                    self._wait_ready(repo, log_start)
                    return self.endpoints
                except ServerError:
                    self._terminate()
                    if not (picked and attempt + 1 < attempts and self._port_clash(log_start)):
                        raise
            raise AssertionError("unreachable")
        except BaseException:
            self.stop()  # never leave a server behind, whatever interrupted the start
            raise

    def _make_dirs(self) -> Path:
        """The work directory (a temporary one of ours unless given) and the log file's; the work directory."""
        if self.work_dir is None:
            self.work_dir = Path(tempfile.mkdtemp(prefix="trtspec-triton-"))
            self._own_work_dir = True
        self.work_dir.mkdir(parents=True, exist_ok=True)
        if self.log_file is None:
            self.log_file = self.work_dir / "tritonserver.log"
        self.log_file = Path(self.log_file).resolve()
        self.log_file.parent.mkdir(parents=True, exist_ok=True)
        return self.work_dir

    def _spawn(self, install: TritonInstall, repo: Path, backend_dir: Path | None) -> int:
        """Start tritonserver on the ports asked (free ones for 0), its output appended to the log file;
        the log's size before, where this start's lines begin."""
        assert self.work_dir is not None and self.log_file is not None
        fresh = iter(free_ports(3, self.host))
        self.endpoints = Endpoints(
            host=self.host,
            http_port=self.http_port or next(fresh),
            grpc_port=self.grpc_port or next(fresh),
            metrics_port=self.metrics_port or next(fresh),
        )
        log_start = self.log_file.stat().st_size if self.log_file.exists() else 0
        self._log_handle = self.log_file.open("ab")
        env = install.env(malloc=self.malloc)
        env[statusfile.ENV] = str(self._fresh_status_dir())
        env[TRITON_URL_ENV] = f"http://{self.endpoints.http}"
        self._proc = subprocess.Popen(
            self._command(install, repo, backend_dir, self.endpoints),
            stdout=self._log_handle,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            cwd=str(self.work_dir),
            start_new_session=True,  # a Ctrl-C meant for us does not reach the server twice
        )
        return log_start

    @property
    def status_dir(self) -> Path | None:
        """Where the models write their status files (None before ``start``)."""
        return self.work_dir / "status" if self.work_dir is not None else None

    def _fresh_status_dir(self) -> Path:
        d = self.status_dir
        assert d is not None
        shutil.rmtree(d, ignore_errors=True)  # no stale file of an earlier server may pass for this one's
        d.mkdir(parents=True, exist_ok=True)
        return d

    def _service_failure(self, since: int) -> str | None:
        """The first "failed to start <service>: <why>" in the log from ``since`` on, None if none."""
        found = re.search(r"failed to start [^\"\n]*", self._log_text(since))
        return found.group(0).strip() if found else None

    def _port_clash(self, since: int) -> bool:
        """Whether the start from ``since`` failed on a port taken (Triton: "failed to start GRPC service:
        Unavailable - Socket '127.0.0.1:8001' already in use", and the same for HTTP and metrics)."""
        return "already in use" in (self._service_failure(since) or "")

    def _command(self, install: TritonInstall, repo: Path, backend_dir: Path | None, ep: Endpoints) -> list[str]:
        cmd = [
            str(install.executable),
            f"--model-repository={repo}",
            "--model-control-mode=explicit",
            "--load-model=*",
            # Our configs are complete; auto-completion would start every Python
            # model's stub once more just to ask it (each import of torch costs seconds).
            "--disable-auto-complete-config",
            f"--http-address={self.host}",
            f"--http-port={ep.http_port}",
            f"--grpc-address={self.host}",
            f"--grpc-port={ep.grpc_port}",
            f"--metrics-address={self.host}",
            f"--metrics-port={ep.metrics_port}",
            "--allow-metrics=true",
            "--allow-gpu-metrics=false",
            f"--log-verbose={self.log_verbose}",
            "--exit-on-error=true",
            "--exit-timeout-secs=10",
        ]
        if backend_dir is not None:
            cmd.append(f"--backend-directory={backend_dir}")
        cmd.extend(self.extra_args)
        return cmd

    def _wait_ready(self, repo: Path, log_start: int) -> None:
        """Until the server and every model are ready and the metrics endpoint answers. Triton goes on
        without its metrics service when it cannot bind the port (it exits for HTTP and gRPC): that
        line in its log (from ``log_start``, this start's) fails the start."""
        assert self._proc is not None and self.endpoints is not None
        models = sorted(p.name for p in repo.iterdir() if (p / "config.pbtxt").is_file())
        base = f"http://{self.endpoints.http}"
        deadline = time.monotonic() + self.startup_timeout_s
        while True:
            code = self._proc.poll()
            failure = self._service_failure(log_start)
            if failure is not None:  # a port taken: one line that names it
                exited = "" if code is None else f" (exited with code {code})"
                raise ServerError(f"tritonserver {failure}{exited}; log: {self.log_file}")
            if code is not None:
                raise ServerError(f"tritonserver exited with code {code} while starting; {self._log_excerpt()}")
            if _http_ok(f"{base}/v2/health/ready") and all(
                _http_ok(f"{base}/v2/models/{m}/ready") for m in models
            ) and _http_ok(self.endpoints.metrics_url):
                return
            if time.monotonic() > deadline:
                raise ServerError(
                    f"tritonserver not ready after {self.startup_timeout_s:.0f}s; {self._log_excerpt()}"
                )
            time.sleep(0.2)  # polling interval while waiting for readiness

    def _log_excerpt(self, lines: int = 8) -> str:
        """Why the server failed: its model-load errors (one line each), else the log's last lines."""
        where = f"log: {self.log_file}"
        failures = self.load_errors()
        if failures:
            return f"{'; '.join(failures)}; {where}"
        tail = self.log_tail(lines)
        return f"{where}; last lines:\n{tail}" if tail else where

    def _log_text(self, since: int = 0) -> str:
        """The server's log so far from byte ``since`` on (a start's lines begin there; "" when there is none yet)."""
        if self.log_file is None or not Path(self.log_file).is_file():
            return ""
        with Path(self.log_file).open("rb") as f:
            f.seek(since)
            return f.read().decode("utf-8", "replace")

    def load_errors(self) -> list[str]:
        """The first line of every "failed to load" error in the log, e.g.
        ``failed to load 'draft' version 1: Internal: RuntimeError: ...``."""
        found: list[str] = []
        for line in self._log_text().splitlines():
            m = _GLOG_ERROR.match(line)
            if m and "failed to load" in m.group(1):
                msg = m.group(1).split("\\n", 1)[0].strip()  # Triton escapes the traceback's newlines
                if msg not in found:
                    found.append(msg)
        return found[-5:]

    def known_abort(self) -> str | None:
        """Why the server aborted, where its log shows a cause we know (:data:`KNOWN_ABORTS`), in one line."""
        text = self._log_text()
        return next((why for sign, why in KNOWN_ABORTS.items() if sign in text), None)

    def log_tail(self, lines: int = 20) -> str:
        return "\n".join(self._log_text().rstrip().splitlines()[-lines:])

    def drain(self, grace_period_s: float) -> DrainReport:
        """Stop taking requests and let the ones in flight finish, for at most ``grace_period_s``
        (:mod:`trtspec.serving.drain`); past it they end with a one-line error. Returns when
        ``spec_decode`` reports none in flight; the server keeps running (``stop`` it next)."""
        d = self.status_dir
        t0 = time.time()
        if d is None or not self.alive():
            return DrainReport(0, 0, 0, 0, 0.0)
        draining.start_drain(d, grace_period_s)
        at_start: int | None = None  # from spec_decode's first status written after the drain began
        cut_at, give_up_at = t0 + grace_period_s, float("inf")
        while self.alive():
            now = time.time()
            fresh = self._requests(t0)
            if fresh is not None and at_start is None:
                at_start = int(fresh.get("in_flight", 0))
            if fresh is not None and fresh.get("in_flight", 0) == 0:
                break  # all answered
            if (fresh is None and now - t0 > 5.0) or now >= give_up_at:
                break  # no spec_decode writing its status, or requests that do not even end
            if now >= cut_at:  # the grace period is over: what still runs ends at its next iteration
                draining.end_grace(d)
                cut_at, give_up_at = float("inf"), now + DRAIN_CUT_WAIT_S
            time.sleep(0.1)  # polling spec_decode's status file
        last = self._requests(0.0) or {}
        outcomes = last.get("outcomes") or {}
        return DrainReport(at_start or 0, int(last.get("in_flight", 0)), int(outcomes.get("shutdown", 0)),
                           int(outcomes.get("draining", 0)), time.time() - t0)

    def _requests(self, written_after: float) -> dict | None:
        """spec_decode's ``requests`` status (``in_flight``, ``outcomes``) if written after ``written_after``."""
        assert self.status_dir is not None
        st = statusfile.read_status(self.status_dir / "spec_decode.json")
        if st is None or st.get("updated_at", 0.0) < written_after:
            return None
        return st.get("requests") or {}

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def wait(self, timeout: float | None = None) -> int | None:
        """Block until the server exits (or ``timeout``); its exit code, None if still running.

        Never in one blocking ``waitpid``: Python runs a signal's handler on the main thread only, when
        that thread next runs Python code, and the kernel may deliver a SIGTERM sent to ``trtspec serve``
        to any of its threads (gRPC's, uvicorn's). A main thread blocked in ``waitpid`` then never ran
        the handler and the server never drained; ``Popen.wait`` with a timeout polls, sleeping at
        most 50 ms at a time, and the handler runs after the sleep it interrupted."""
        if self._proc is None:
            return None
        while True:
            try:
                return self._proc.wait(_WAIT_STEP_S if timeout is None else timeout)
            except subprocess.TimeoutExpired:
                if timeout is not None:
                    return None

    def stop(self, timeout_s: float = 30.0) -> int | None:
        """SIGTERM the server (Triton unloads models and exits), SIGKILL its group after ``timeout_s``;
        remove the work directory we made (kept, minus the backends, when it holds the log)."""
        code = self._terminate(timeout_s)
        if self._own_work_dir and self.work_dir is not None:
            keep_log = self.log_file is not None and self.work_dir in Path(self.log_file).parents
            shutil.rmtree(self.work_dir / "backends" if keep_log else self.work_dir, ignore_errors=True)
        return code

    def _terminate(self, timeout_s: float = 30.0) -> int | None:
        proc, self._proc = self._proc, None
        code = None
        if proc is not None:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout_s)
                except subprocess.TimeoutExpired:
                    _kill_group(proc.pid)
                    proc.wait(10)
            code = proc.returncode
            # Python stubs are the server's children, in its process group.
            _kill_group(proc.pid)
        if self._log_handle is not None:
            self._log_handle.close()  # type: ignore[attr-defined]
            self._log_handle = None
        return code

    def __enter__(self) -> TritonServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


# what a server's log shows when it aborts for a reason we know -> that reason, for the operator
KNOWN_ABORTS = {
    "boost::interprocess::lock_exception": (
        "a Python-backend stub died holding a lock in the memory it shares with the server, and Triton "
        "aborted (upstream triton-inference-server/server#8882; docs/reliability.md, \"A stub killed mid-call\")"),
}
_GLOG_ERROR = re.compile(r'^E\d{4} [\d:.]+\s+\d+ \S+\] "(.*?)"?$')


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _http_ok(url: str, timeout: float = 2.0) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status == 200
    except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
        return False
