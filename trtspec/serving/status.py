"""Readiness that tells the truth: does each model actually answer, and is speculation on?

Triton's ``/v2/models/<m>/ready`` keeps saying 200 for a model whose stub is
dead (docs/reliability.md, "Why we need our own supervisor"), so :func:`collect_status` asks each model for real:

- ``draft`` / ``target``: a two-token forward on a throw-away session, then
  its release, over Triton's HTTP ``infer`` (no logits sent back);
- ``spec_decode``: a one-token ``generate`` with speculation off;

all at once, each bounded by ``timeout_s``. Beside the answers it reads the
status files the models write (:mod:`trtspec.serving.statusfile`):
``spec_decode``'s control state (supervisor state of draft and target,
reloads, calls in flight, last progress, probe state, breaker, whether new
requests speculate) and each model's KV-cache session count.

Busy is not dead: a model whose calls in flight still progress (``spec_decode``
says so) is not probed -- the probe would queue behind a long prefill and time
out -- and counts as answering; so does ``spec_decode`` when its probe timed
out behind such a target. ``ready`` is true when ``spec_decode`` and
``target`` answer (or are busy that way) and the server is not draining
(:mod:`trtspec.serving.drain`).

:class:`StatusServer` serves it over HTTP for ``trtspec serve``:
``GET /status`` (always 200, the JSON) and ``GET /ready`` (200 when ready,
else 503, same JSON; while draining, 503 at once with ``ready`` and ``draining``
only: a load balancer's check must not wait on probes queued behind the
requests in flight). ``trtspec status --url HOST:PORT`` reads ``/status``
(:func:`fetch_status`) and prints :func:`format_status`.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from trtspec.errors import TrtspecError, one_line
from trtspec.wire import DRAFT, SPEC_DECODE, TARGET
from trtspec.serving import statusfile
from trtspec.serving.drain import read_drain

STALE_AFTER_S = 10.0  # a spec_decode status file older than this is stale (its writer is stuck or dead)


class StatusError(TrtspecError):
    """The status endpoint could not be reached or answered nonsense."""


def _http(url: str, body: dict | None, timeout_s: float) -> tuple[int, Any]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method="POST" if data is not None else "GET",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as r:
            raw = r.read()
            return r.status, json.loads(raw) if raw else None
    except urllib.error.HTTPError as e:
        raw = e.read()
        try:
            return e.code, json.loads(raw) if raw else None
        except ValueError:
            return e.code, {"error": raw.decode(errors="replace")}


def _error_text(e: BaseException | Any) -> str:
    if isinstance(e, dict):
        return one_line(str(e.get("error", e)))
    if isinstance(e, urllib.error.URLError):
        return one_line(str(e.reason))
    return one_line(e)


def _timed(fn: Any) -> dict:
    t0 = time.perf_counter()
    try:
        err = fn()
    except Exception as e:  # unreachable, timeout, ...
        err = _error_text(e)
    ms = (time.perf_counter() - t0) * 1000
    return {"answers": err is None, "latency_ms": round(ms, 1), "error": err}


def probe_lm(http: str, model: str, timeout_s: float = 5.0) -> dict:
    """Ask ``model`` (the draft/target protocol) for a real forward pass; ``{answers, latency_ms, error}``."""
    sid = f"__trtspec_status__:{uuid.uuid4().hex[:12]}"

    def tensors(token_ids: list[int], release: bool) -> dict:
        inputs = [
            {"name": "session_id", "shape": [1], "datatype": "BYTES", "data": [sid]},
            {"name": "token_ids", "shape": [len(token_ids)], "datatype": "INT64", "data": token_ids},
            {"name": "num_logits", "shape": [1], "datatype": "INT32", "data": [0]},
        ]
        if release:
            inputs.append({"name": "release", "shape": [1], "datatype": "BOOL", "data": [True]})
        return {"inputs": inputs, "outputs": [{"name": "draft_ids"}]}

    def run() -> str | None:
        url = f"http://{http}/v2/models/{model}/infer"
        code, body = _http(url, tensors([1, 2], False), timeout_s)
        if code != 200:
            return _error_text(body or f"HTTP {code}")
        _http(url, tensors([], True), timeout_s)  # best effort: LRU eviction frees it otherwise
        return None

    return _timed(run)


def probe_spec_decode(http: str, model: str = SPEC_DECODE, timeout_s: float = 5.0) -> dict:
    """One token through ``spec_decode`` (speculation off: the draft's health is reported separately)."""

    def run() -> str | None:
        body = {"text_input": "ping", "max_tokens": 1, "speculation": "off"}
        code, out = _http(f"http://{http}/v2/models/{model}/generate", body, timeout_s)
        return None if code == 200 else _error_text(out or f"HTTP {code}")

    return _timed(run)


def collect_status(http: str, status_dir: Path | None, *, timeout_s: float = 5.0, model: str = SPEC_DECODE) -> dict:
    """The whole picture; see the module docstring. ``http``: Triton's HTTP ``HOST:PORT``; ``model``: the name
    spec_decode is served under."""
    base = f"http://{http}"
    live = _ok(base + "/v2/health/live")
    index = _repository_index(base) if live else {}
    names = [m for m in (model, TARGET, DRAFT) if m in index] or (
        [model, TARGET, DRAFT] if not index else []
    )
    control = statusfile.read_status(status_dir / f"{model}.json") if status_dir is not None else None
    stale = control is None or control.get("age_s", 0.0) > STALE_AFTER_S
    busy = {m: not stale and bool(((control or {}).get(m) or {}).get("busy")) for m in (TARGET, DRAFT)}
    drain = read_drain(status_dir)
    answers = _answers(http, model, names, busy, drain, timeout_s)
    models: dict[str, dict] = {}
    for m in names:
        entry: dict = {"triton_state": index.get(m), "triton_ready": _ok(f"{base}/v2/models/{m}/ready"), **answers[m]}
        if m in (TARGET, DRAFT):
            entry["supervisor"] = (control or {}).get(m)
            own = statusfile.read_status(status_dir / f"{m}.json") if status_dir is not None else None
            entry["sessions"] = own.get("sessions") if own else None
            entry["faults"] = (own or {}).get("faults") or None
        models[m] = entry
    sd, tg = models.get(model, {}), models.get(TARGET, {})
    speculation, why = _speculation(control, stale, models)
    governor = (control or {}).get("governor") or {}
    return {
        "checked_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "ready": bool(sd.get("answers")) and bool(tg.get("answers")) and drain is None,
        "draining": drain,
        "speculation": speculation,
        "speculation_reason": why,
        "server": {"live": live, "ready": _ok(base + "/v2/health/ready") if live else False},
        "models": models,
        "breaker": (control or {}).get("breaker"),
        "requests": (control or {}).get("requests"),
        "goodput": governor.get("goodput"),
        "k_choices": governor.get("k_choices"),
        "control_age_s": None if control is None else round(control.get("age_s", 0.0), 1),
    }


def _ok(url: str) -> bool:
    try:
        return _http(url, None, 2.0)[0] == 200
    except Exception:
        return False


def _repository_index(base: str) -> dict[str, str]:
    """Model name -> state from Triton's repository index ({} when it cannot be read)."""
    try:
        code, body = _http(base + "/v2/repository/index", {}, 2.0)
    except Exception:
        return {}
    if code != 200 or not isinstance(body, list):
        return {}
    return {m["name"]: m.get("state", "") for m in body if isinstance(m, dict) and "name" in m}


def _answers(http: str, model: str, names: list[str], busy: dict[str, bool], drain: dict | None,
             timeout_s: float) -> dict[str, dict]:
    """Whether each model answers now: probed at once, except a model busy with calls in flight (those
    are the check) and spec_decode while it drains (a probe would be one more refusal)."""
    skip = {m: {"answers": True, "busy": True, "latency_ms": None, "error": None}
            for m, b in busy.items() if b}
    if drain is not None:
        skip[model] = {"answers": False, "latency_ms": None, "error": "draining: new requests are refused"}
    with ThreadPoolExecutor(max(1, len(names))) as pool:
        futures = {
            m: pool.submit(probe_spec_decode if m == model else probe_lm, http, m, timeout_s)
            for m in names if m not in skip
        }
        answers = {m: f.result() for m, f in futures.items()}
    answers.update({m: a for m, a in skip.items() if m in names})
    if model in futures and not answers[model]["answers"] and busy[TARGET]:
        answers[model] = {**answers[model], "answers": True, "busy": True}  # queued behind the target
    return answers


def _speculation(control: dict | None, stale: bool, models: dict[str, dict]) -> tuple[str, str]:
    """Speculation on/off/unknown and why, from spec_decode's status (and whether the draft answers)."""
    if control is None:
        speculation, why = "unknown", "no status from spec_decode"
    elif stale:
        speculation, why = "unknown", f"spec_decode's status is {control.get('age_s', 0):.0f}s old"
    else:
        speculation, why = control.get("speculation", "unknown"), control.get("speculation_reason", "")
    if speculation != "off" and DRAFT in models and not models[DRAFT]["answers"]:
        why = f"{why}; but the draft does not answer now"
    return speculation, why


class StatusServer:
    """``GET /status`` and ``GET /ready`` on ``host:port`` (0: a free port), on a daemon thread."""

    def __init__(self, triton_http: str, status_dir: Path | None, host: str = "127.0.0.1", port: int = 0,
                 timeout_s: float = 5.0, model: str = SPEC_DECODE) -> None:
        self.triton_http = triton_http
        self.model = model
        self.status_dir = status_dir
        self.timeout_s = timeout_s
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                path = self.path.split("?", 1)[0].rstrip("/")
                if path not in ("/status", "/ready"):
                    self._send(404, {"error": f"no such endpoint {path!r}; try /status or /ready"})
                    return
                drain = read_drain(outer.status_dir) if path == "/ready" else None
                if drain is not None:  # not ready, whatever the models say: no probe to wait for
                    self._send(503, {"ready": False, "draining": drain})
                    return
                st = collect_status(outer.triton_http, outer.status_dir, timeout_s=outer.timeout_s,
                                    model=outer.model)
                self._send(200 if path == "/status" or st["ready"] else 503, st)

            def _send(self, code: int, body: dict) -> None:
                data = json.dumps(body, default=str).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:  # quiet: the serve command's stderr is for its own lines
                pass

        self._httpd = ThreadingHTTPServer((host, port), Handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="trtspec-status-http", daemon=True)

    @property
    def address(self) -> tuple[str, int]:
        host, port = self._httpd.server_address[:2]
        return str(host), int(port)

    @property
    def url(self) -> str:
        host, port = self.address
        host = "127.0.0.1" if host in ("0.0.0.0", "", "::") else host
        return f"http://{host}:{port}/status"

    def start(self) -> StatusServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()


def fetch_status(url: str, timeout_s: float = 30.0) -> dict:
    """``GET /status`` of a ``trtspec serve`` status endpoint (``HOST:PORT`` or a full URL)."""
    full = url if "://" in url else f"http://{url}"
    if not full.rstrip("/").endswith(("/status", "/ready")):
        full = full.rstrip("/") + "/status"
    try:
        code, body = _http(full, None, timeout_s)
    except (urllib.error.URLError, OSError) as e:
        raise StatusError(f"cannot reach the status endpoint {full}: {_error_text(e)}") from None
    if not isinstance(body, dict) or "ready" not in body:
        raise StatusError(f"{full} answered HTTP {code} without a trtspec status")
    return body


def format_status(st: dict) -> list[str]:
    """Human lines, one per subject."""
    lines = [f"{'ready':<12} {'yes' if st.get('ready') else 'NO'}"]
    if st.get("draining"):
        lines.append(f"{'draining':<12} yes: new requests refused, grace period {st['draining'].get('grace_period_s')}s")
    server = st.get("server", {})
    lines.append(f"{'server':<12} {'live' if server.get('live') else 'NOT LIVE'}, "
                 f"{'ready' if server.get('ready') else 'not ready'}")
    lines += [f"{name:<12} {_model_text(m)}" for name, m in st.get("models", {}).items()]
    lines.append(f"{'breaker':<12} {_breaker_text(st.get('breaker'))}")
    lines.append(f"{'speculation':<12} {st.get('speculation')} ({st.get('speculation_reason')})")
    if st.get("goodput"):
        lines.append(f"{'goodput':<12} {_goodput_text(st['goodput'])}")
    if st.get("k_choices"):
        most = sorted(st["k_choices"].items(), key=lambda kv: -kv[1])
        lines.append(f"{'k chosen':<12} " + ", ".join(f"{why} {n}" for why, n in most) + " (iterations, since start)")
    req = st.get("requests")
    if req:
        lines.append(f"{'requests':<12} {req.get('in_flight', 0)} in flight; outcomes {req.get('outcomes', {})}")
    return lines


def _model_text(m: dict) -> str:
    """One model's line: whether it answers, what Triton says, its supervisor, sessions and faults."""
    said = "ready" if m.get("triton_ready") else "not ready"
    if m.get("busy"):
        head = "busy (not probed: its calls in flight are progressing)"
    elif m.get("answers"):
        head = f"answers ({m.get('latency_ms', 0):.0f} ms)"
    else:
        head = f"DOES NOT ANSWER: {m.get('error')}"
    parts = [head, f"Triton says {said}"]
    sup = m.get("supervisor")
    if sup:
        parts += [_supervisor_text(sup), _calls_text(sup)]
        if sup.get("deadline"):
            parts.append(_deadline_text(sup["deadline"]))
    if m.get("sessions") is not None:
        parts.append(f"{m['sessions']} session(s)")
    if m.get("faults"):
        parts.append(f"FAULTS {m['faults']}")
    return "; ".join(parts)


def _supervisor_text(sup: dict) -> str:
    """The draft supervisor's state, its last error, next attempt, reloads and last outage."""
    s = f"supervisor {sup.get('state')}"
    if sup.get("state") != "healthy" and sup.get("last_error"):
        s += f" ({sup['last_error']})"
    if sup.get("next_attempt_in_s") is not None:
        s += f", next attempt in {sup['next_attempt_in_s']:.0f}s"
    if sup.get("reloads"):
        s += f", {sup['reloads']} reload(s)"
    last = sup.get("last_outage")
    if last and last.get("downtime_s") is not None:
        s += f", last outage {last['downtime_s']:.1f}s"
    return s


def _breaker_text(b: dict | None) -> str:
    if not b:
        return "unknown"
    rate = b.get("rejection_rate")
    rate_s = "n/a" if rate is None else f"{rate:.1%}"
    return f"{b.get('state')} (rejection rate {rate_s} per tested position, {b.get('window_drafted', 0)} drafted tokens)"


def _goodput_text(g: dict) -> str:
    """The draft model's goodput estimates in one line: the k it would draft now and why."""
    acc = " ".join(f"{a:.2f}" for a in g.get("acceptance_per_position", []))
    cost = g.get("draft_cost_ratio")
    cost_s = "draft cost not measured yet" if cost is None else f"a draft token costs {cost:.2f} of a target step"
    be = g.get("breakeven_acceptance", 1.0)
    pays = "nothing pays at any acceptance" if be >= 1.0 else f"drafting pays above {be:.2f}"
    text = f"k now {g.get('k_best_now')}; acceptance per position {acc}; {cost_s}; {pays}"
    return text + ("; young: still measuring its first drafts" if g.get("young") else "")


def _deadline_text(d: dict) -> str:
    """The draft's adaptive deadline in a few words: now, what it is made of, how many calls missed it."""
    if d.get("fixed"):
        head = f"deadline fixed at {d['deadline_s'] * 1000:.0f} ms"
    elif d.get("p95_s") is None:
        head = f"deadline {d['deadline_s'] * 1000:.0f} ms (not measured yet)"
    else:
        rate = d.get("read_s_per_token")
        reads = "reads not measured yet" if rate is None else f"+ {rate * 1000:.2f} ms a token read"
        times = f"{d['multiplier']:g} x " if d.get("multiplier") else ""  # a server older than this CLI: none
        head = f"deadline {d['deadline_s'] * 1000:.0f} ms ({times}p95 {d['p95_s'] * 1000:.0f} ms; {reads})"
    return f"{head}; {d.get('late', 0)} late of {d.get('late', 0) + d.get('on_time', 0)} calls"


def _calls_text(sup: dict) -> str:
    """``N in flight, last progress Xs ago, probe <state>`` from a supervisor's snapshot."""
    calls = sup.get("calls") or {}
    age = calls.get("last_answer_age_s")
    if age is None:
        age = sup.get("last_answer_age_s")
    text = f"{calls.get('in_flight', 0)} in flight"
    if calls.get("stuck_calls"):
        text += f" ({calls['stuck_calls']} past their deadline)"
    text += f", last progress {'never' if age is None else f'{age:.1f}s ago'}"
    probe = sup.get("probe") or {}
    if probe:
        text += f", probe {probe.get('state')}"
        if probe.get("last_ok") is not None:
            text += f" (last {'answered' if probe['last_ok'] else 'FAILED'} in {probe.get('last_seconds', 0):.2f}s)"
    return text
