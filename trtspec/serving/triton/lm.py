"""The ``draft`` and ``target`` models of the torch backend: a runtime plus its KV caches.

Inputs and outputs: ``wire.LM_INPUTS`` / ``LM_OUTPUTS`` (the BLS protocol
``spec_decode`` speaks). Caches live in a :class:`~trtspec.serving.sessions.SessionStore`,
one per sequence, evicted LRU. Not decoupled: ``execute`` answers each request
of the batch in order; a bad request gets ``INVALID_ARG`` and the others
their logits.

Model parameters (``config.pbtxt``, all strings): :class:`~trtspec.wire.LMParams`
(table in docs/serving.md); unknown keys are refused at load (a typo must not
pass silently). The ``fault_*`` parameters inject faults (for chaos runs on real
models; the draft only -- a faulty target would change outputs -- and logged
loudly at load): the runtime is wrapped with :mod:`trtspec.testing.faults`
after the warm-up.

Threads: on CPU the models are processes sharing the same cores. While
``spec_decode`` runs one request, draft and target take turns and each uses all
its torch threads; with several requests speculating at once both compute at
the same time, and each call then says so (input ``cpu_share`` = 2): the model
runs half its threads, so the two never hold more threads than there are
cores (OpenMP threads that wait on a descheduled partner waste the core the
other model needs; see docs/serving.md for the figures).

With ``TRTSPEC_STATUS_DIR`` set (the launcher sets it) the model writes
``<dir>/<name>.json``: sessions held, cache bytes, store counters
(:mod:`trtspec.serving.statusfile`).
"""

from __future__ import annotations

import json
import random
import time
import traceback
from typing import Any

import numpy as np

from trtspec.errors import InvalidRequestError, one_line
from trtspec.serving import statusfile
from trtspec.serving.sessions import SessionStore
from trtspec.serving.triton import error_code, load_pb_utils, model_parameters
from trtspec.decoding.types import LogitBias, Penalties, SamplingParams
from trtspec.wire import LMParams


class TritonPythonModel:
    """``draft`` / ``target``: see the module docstring."""

    def __init__(self, pb: Any = None) -> None:
        self._pb_override = pb
        self.pb: Any = None
        self.name = ""
        self.store: SessionStore | None = None
        self.loaded: Any = None
        self.warmup_s: float | None = None
        self.faults: dict[str, float] = {}
        self._status_path = None
        self._status_written = 0.0
        self._status_sessions = -1
        self._threads = 0  # torch threads at load (the most a call may use)
        self._threads_now = 0
        self.set_threads: Any = None  # torch.set_num_threads (tests put a recorder here)

    # -- Triton entry points -------------------------------------------------

    def initialize(self, args: dict) -> None:
        import torch

        from trtspec.runtime.torch.loader import load_model

        self.pb = load_pb_utils(self._pb_override)
        config = json.loads(args["model_config"])
        self.name = args.get("model_name") or config.get("name", "lm")
        params = LMParams.from_parameters(model_parameters(config), self.name)
        if params.num_threads > 0:
            torch.set_num_threads(params.num_threads)
        self._threads = self._threads_now = torch.get_num_threads()
        if self.set_threads is None:
            self.set_threads = torch.set_num_threads
        self.loaded = load_model(
            params.checkpoint,
            params.precision,  # type: ignore[arg-type]
            params.device,
            max_context=params.max_context or None,
            exact=params.exact_mode,
        )
        self.store = SessionStore(self.loaded.lm, params.max_sessions)
        self._memory = _MemoryGauge(self.pb, self.name, self.loaded.weight_bytes)
        if params.warmup:
            self.warmup_s = self.warm_up()
        if params.has_faults:  # after the warm-up: faults must not fail the load
            self.store = SessionStore(self._with_faults(self.loaded.lm, params), params.max_sessions)
            self.pb.Logger.log_warn(f"trtspec {self.name}: FAULT INJECTION ACTIVE {self.faults}")
        self._status_path = statusfile.status_path(self.name)
        self._write_status(force=True)
        self.pb.Logger.log_info(
            f"trtspec {self.name}: {self.loaded.path} ({self.loaded.impl}, {self.loaded.precision}) loaded in "
            f"{self.loaded.load_time_s:.2f}s; vocab {self.loaded.lm.vocab_size}, context {self.loaded.lm.max_context}, "
            f"exact {self.loaded.exact}, graphs {self.loaded.graphs.to_dict() if self.loaded.graphs else 'off'}, "
            f"warm-up {self.warmup_s if self.warmup_s is not None else 'off'}"
        )

    def execute(self, requests: list) -> list:
        try:
            return self._execute(requests)
        finally:
            if self.store is not None:
                self._memory.update(self.store.cache_bytes())
                self._write_status()

    def _execute(self, requests: list) -> list:
        responses = []
        for request in requests:
            try:
                responses.append(self._one(request))
            except InvalidRequestError as e:
                responses.append(self._error(str(e), "INVALID_ARG"))
            except Exception as e:  # one request's failure must not fail the others
                self.pb.Logger.log_error(f"trtspec {self.name}: {traceback.format_exc()}")
                responses.append(self._error(f"{self.name} failed: {type(e).__name__}: {one_line(e)}", "INTERNAL"))
        return responses

    def finalize(self) -> None:
        if self.store is not None:
            self.store.clear()
            self._write_status(force=True)

    # -- faults and status -------------------------------------------------------

    def _with_faults(self, lm: Any, p: LMParams) -> Any:
        """``lm`` wrapped in the fault injectors the parameters ask for."""
        from trtspec.testing.faults import UnreliableDraft, WrongTokenDraft

        self.faults = {"wrong_share": p.fault_wrong_share, "fail_share": p.fault_fail_share,
                       "delay_s": p.fault_delay_s, "delay_share": p.fault_delay_share, "seed": p.fault_seed}
        if p.fault_wrong_share:
            lm = WrongTokenDraft(lm, p.fault_wrong_share, seed=p.fault_seed)
        if p.fault_fail_share or p.fault_delay_s:
            rng = random.Random(p.fault_seed + 1)

            def sleep(seconds: float) -> None:  # a delayed share of the forward passes
                if rng.random() < p.fault_delay_share:
                    time.sleep(seconds)

            lm = UnreliableDraft(lm, delay_s=p.fault_delay_s, fail_share=p.fault_fail_share, seed=p.fault_seed,
                                 sleep=sleep)
        return lm

    def _write_status(self, force: bool = False) -> None:
        """``<status dir>/<name>.json`` when the session count changed or a second passed; never raises."""
        if self._status_path is None or self.store is None:
            return
        n = len(self.store)
        now = time.monotonic()
        if not force and n == self._status_sessions and now - self._status_written < 1.0:
            return
        self._status_sessions, self._status_written = n, now
        s = self.store.stats
        statusfile.write_status(self._status_path, {
            "model": self.name,
            "sessions": n,
            "max_sessions": self.store.max_sessions,
            "cache_bytes": self.store.cache_bytes(),
            "weight_bytes": self.loaded.weight_bytes if self.loaded is not None else None,
            "store": {"calls": s.calls, "hits": s.hits, "misses": s.misses, "evictions": s.evictions,
                      "releases": s.releases},
            "faults": self.faults,
            "threads": {"now": self._threads_now, "max": self._threads},
        })

    # -- one request -------------------------------------------------------------

    def _one(self, request: Any) -> Any:
        pb = self.pb
        assert self.store is not None
        session_id = _scalar(pb, request, "session_id")
        if isinstance(session_id, bytes):
            session_id = session_id.decode("utf-8", errors="replace")
        if not isinstance(session_id, str) or not session_id:
            raise InvalidRequestError("session_id must be a non-empty string")
        release = _scalar(pb, request, "release", required=False)
        vocab = self.store.lm.vocab_size
        if release is not None and bool(release):
            self.store.release(session_id)
            return self._logits(np.zeros((0, vocab), dtype=np.float32))
        self._share_cpu(_scalar(pb, request, "cpu_share", required=False))
        num_draft = _scalar(pb, request, "num_draft", required=False)
        ids_t = pb.get_input_tensor_by_name(request, "token_ids")
        if ids_t is None:
            raise InvalidRequestError("input 'token_ids' is required")
        ids = ids_t.as_numpy()
        if ids.dtype.kind not in "iu":
            raise InvalidRequestError(f"token_ids must be integers, got {ids.dtype}")
        if num_draft is not None and int(num_draft) > 0:
            proposal = self.store.propose(
                session_id, ids.reshape(-1), int(num_draft), self._sampling(request), _seed(pb, request)
            )
            q = proposal.q.float().cpu().numpy() if proposal.q is not None else np.zeros((0, vocab), np.float32)
            return self._respond(np.zeros((0, vocab), np.float32), np.asarray(proposal.tokens, np.int64), q)
        num_logits = _scalar(pb, request, "num_logits")
        if isinstance(num_logits, (bool, np.bool_)) or not isinstance(num_logits, (int, np.integer)):
            raise InvalidRequestError(f"num_logits must be an integer, got {num_logits!r}")
        if bool(_scalar(pb, request, "return_argmax", required=False) or False):
            argmax_ids = self.store.run(session_id, ids.reshape(-1), int(num_logits), argmax=True)
            empty = np.zeros((0, vocab), np.float32)
            return self._respond(empty, np.zeros(0, np.int64), empty, argmax_ids.cpu().numpy())
        logits = self.store.run(session_id, ids.reshape(-1), int(num_logits))
        return self._logits(logits.float().cpu().numpy())

    def _share_cpu(self, share: Any) -> None:
        """Run ``1 / share`` of the load-time threads (at least one) for this call and the next ones."""
        if share is None:
            share = 1
        if isinstance(share, (bool, np.bool_)) or not isinstance(share, (int, np.integer)) or share < 1:
            raise InvalidRequestError(f"cpu_share must be an integer >= 1, got {share!r}")
        want = max(1, self._threads // int(share))
        if want != self._threads_now:
            self.set_threads(want)
            self._threads_now = want

    def _sampling(self, request: Any) -> SamplingParams:
        def opt(name: str, default: Any) -> Any:
            v = _scalar(self.pb, request, name, required=False)
            return default if v is None else v

        exact_seed = opt("exact_seed", None)
        sampling = SamplingParams(
            temperature=float(opt("temperature", 0.0)), top_k=int(opt("top_k", 0)), top_p=float(opt("top_p", 1.0)),
            seed=None if exact_seed is None else int(exact_seed), exact=exact_seed is not None,
            penalties=Penalties.from_inputs(lambda name: opt(name, None)),
            logit_bias=LogitBias(tuple(int(t) for t in _vector(self.pb, request, "logit_bias_ids")),
                                 tuple(float(v) for v in _vector(self.pb, request, "logit_bias_values"))),
        )
        sampling.validate()
        return sampling

    def _logits(self, arr: np.ndarray) -> Any:
        vocab = arr.shape[1] if arr.ndim == 2 else 0
        return self._respond(arr, np.zeros(0, np.int64), np.zeros((0, vocab), np.float32))

    def _respond(
        self, logits: np.ndarray, draft_ids: np.ndarray, draft_probs: np.ndarray, argmax_ids: np.ndarray | None = None
    ) -> Any:
        pb = self.pb
        return pb.InferenceResponse(
            output_tensors=[
                pb.Tensor("logits", np.ascontiguousarray(logits, np.float32)),
                pb.Tensor("draft_ids", np.ascontiguousarray(draft_ids, np.int64)),
                pb.Tensor("draft_probs", np.ascontiguousarray(draft_probs, np.float32)),
                pb.Tensor("argmax_ids", np.ascontiguousarray(
                    argmax_ids if argmax_ids is not None else np.zeros(0, np.int64), np.int64)),
            ]
        )

    def _error(self, message: str, code: str) -> Any:
        pb = self.pb
        return pb.InferenceResponse(output_tensors=[], error=pb.TritonError(message, error_code(pb, code)))

    # -- warm-up -----------------------------------------------------------------

    def warm_up(self) -> float:
        """Run one dummy sequence through every call shape the loop uses, so the first request does not pay for lazy initialisation."""
        assert self.store is not None
        lm = self.store.lm
        t0 = time.perf_counter()
        n = max(2, min(32, lm.max_context - 8))
        prompt = (np.arange(n, dtype=np.int64) * 7 + 3) % lm.vocab_size
        sid = "__trtspec_warmup__"
        seq = list(prompt)
        self.store.run(sid, seq, 1)  # prefill
        for step in range(min(3, lm.max_context - n - 6)):  # decode steps
            seq.append((step * 11 + 5) % lm.vocab_size)
            self.store.run(sid, seq, 1, argmax=True)  # greedy decoding asks for argmax ids
        verify = [(i * 13 + 1) % lm.vocab_size for i in range(min(5, lm.max_context - len(seq)))]
        if verify:
            self.store.run(sid, seq + verify, len(verify), argmax=True)  # verify k tokens in one pass
            self.store.run(sid, seq + verify[:1], 1)  # rollback + bonus (logits: sampling)
        self.store.release(sid)
        self.store.stats = type(self.store.stats)()  # warm-up does not count
        return time.perf_counter() - t0


class _MemoryGauge:
    """``trtspec_model_memory_bytes{model, role}``: weights plus the KV caches held now.

    Set only when the figure changed: a metric call from a Python backend model is
    a round trip to the server (~80 us on a 2-core EPYC), and most calls leave the
    caches as they were."""

    def __init__(self, pb: Any, name: str, weight_bytes: int) -> None:
        from trtspec.obs import TritonMetricSink
        from trtspec.obs import metrics as M

        self._sink = TritonMetricSink(pb)
        self._spec = M.MODEL_MEMORY
        self._labels = {"model": name, "role": name if name in ("draft", "target") else "model"}
        self._weights = weight_bytes
        self._shown: int | None = None
        self.update(0)

    def update(self, cache_bytes: int) -> None:
        value = self._weights + cache_bytes
        if value == self._shown:
            return
        try:
            self._sink.set(self._spec, self._labels, value)
            self._shown = value
        except Exception:  # a metric must never fail a request
            pass


def _scalar(pb: Any, request: Any, name: str, required: bool = True) -> Any:
    t = pb.get_input_tensor_by_name(request, name)
    if t is None:
        if required:
            raise InvalidRequestError(f"input '{name}' is required")
        return None
    arr = t.as_numpy().reshape(-1)
    if arr.size != 1:
        raise InvalidRequestError(f"input '{name}' must hold one value, got {arr.size}")
    return arr[0].item() if arr.dtype != np.object_ else arr[0]


def _vector(pb: Any, request: Any, name: str) -> list:
    """A 1-D input's values ([] when not sent)."""
    t = pb.get_input_tensor_by_name(request, name)
    return [] if t is None else t.as_numpy().reshape(-1).tolist()


def _seed(pb: Any, request: Any) -> int | None:
    seed = _scalar(pb, request, "seed", required=False)
    if seed is None:
        return None
    if int(seed) < 0:
        raise InvalidRequestError(f"seed must be >= 0, got {seed}")
    return int(seed)
