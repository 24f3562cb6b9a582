"""The ``spec_decode`` model: validate, route, run the draft-verify loop, stream.

Decoupled. ``execute`` validates each request of the batch (a bad one gets
``INVALID_ARG`` at once, the others go on) and hands the good ones to a small
thread pool, so several requests progress concurrently. A worker tokenizes the
prompt, asks the control plane's governor (:mod:`trtspec.control`: routing,
rollout, admission, breaker) whether and how much to speculate, and runs the
unchanged :class:`~trtspec.spec.SpeculativeDecoder` on BLS proxies of the
``draft`` and ``target`` models (:mod:`trtspec.serving.triton.bls`), so the
draft runs in its own process. With ``stream`` true every loop chunk with text
is sent as it is made; the final response (the final flag, sent exactly once
per request, also on error) carries the per-request counts.

Errors map to Triton codes with one-line messages, never a traceback:
a malformed request -> ``INVALID_ARG``; the client cancelled -> ``CANCELLED``
(the loop checks the response sender's ``is_cancelled()`` every iteration); the target model
failed, is known down, or too many requests wait -> ``UNAVAILABLE``; anything else ->
``INTERNAL`` (traceback in the server log). A failing or late draft is not an
error: the loop goes on with the target. Supervision, deadlines and the status
file: :mod:`trtspec.serving.triton.health` (docs/reliability.md).

Model parameters (``config.pbtxt``, all strings):

=======================  =====================================================
``tokenizer_dir``        tokenizer of the pair (required)
``target_model``         target model name (``target``)
``draft_model``          draft model name; empty: target alone
``model_backend``        what ``draft``/``target`` are: ``python`` (trtspec's torch models, the
                         ``protocol.LM_INPUTS`` protocol; default) or ``tensorrtllm`` (TensorRT-LLM
                         engines on Triton's ``tensorrtllm`` backend: :mod:`.trtllm_bls`)
``vocab_size``           logits rows of both models (required)
``target_max_context``   target's context window in tokens (required)
``draft_max_context``    draft's context window (required with a draft)
``max_tokens_limit``     largest ``max_tokens`` a request may ask (1024)
``draft_length``         most tokens drafted per iteration (caps the policy's ``k_max``; 5)
``max_concurrency``      requests decoded at once (worker threads, 8)
``apply_chat_template``  wrap ``text_input`` in the tokenizer's chat template (true)
``warmup``               warm the loop and tokenizer at load (true)
``policy_file``          control-plane policy file (YAML; default: the built-in policy)
``manifest_file``        build manifest (``engines/<name>/manifest.json``); checked at load, see below
``manifest_check``       ``full`` (default): refuse to load when the engines next to ``manifest_file``
                         were built for another backend, trtspec or torch major.minor, TensorRT-LLM
                         version or GPU, or a file differs from the build (sha256); ``quick``: the
                         same with file sizes instead of hashes; ``off``: no check
``trace_file``           rejection trace (JSONL, rotated); empty: no trace
``trace_sample_rate``    share of rejections traced (0.01)
``max_queue``            requests waiting for a worker before new ones are refused
                         with ``UNAVAILABLE`` (64)
``max_text_bytes``       largest ``text_input`` in bytes (0: 32 x ``target_max_context``, at least 64 KiB)
``supervise``            reload a dead draft/target, probe it, resume (true)
``draft_timeout_s``      fixed deadline of a draft call; 0: adaptive (0)
``draft_timeout_floor_s``  adaptive deadline's floor (0.05)
``draft_timeout_max_s``  adaptive deadline's ceiling, and its value before measurements (2.0)
``draft_timeout_multiplier``  adaptive deadline = multiplier x p95 of recent draft calls (4.0)
``draft_late_strikes``   late draft calls in a row that make the supervisor probe it (3; 0: never)
``target_timeout_s``     deadline of a target call; 0: none (60)
``probe_timeout_s``      deadline of a supervisor probe (30)
``health_interval_s``    probe a model that answered nothing for this long; 0: never (5)
``reload_backoff_initial_s``  wait before the 2nd reload attempt, doubling (1.0)
``reload_backoff_max_s``  longest wait between reload attempts (60)
=======================  =====================================================
"""

from __future__ import annotations

import json
import threading
import time
import traceback
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from trtspec.control import Policy, RequestInfo, SpeculationGovernor, load_policy
from trtspec.control.config import Priority
from trtspec.control.governor import RequestControl
from trtspec.control.types import Speculation as ControlSpeculation
from trtspec.errors import InvalidRequestError
from trtspec.obs import RejectionTracer, SpecMetrics, TokenTimer, TritonMetricSink
from trtspec.protocol import SPEC_DECODE, Speculation
from trtspec.serving.request import ServeRequest, parse_request
from trtspec.serving.supervisor import SupervisorConfig
from trtspec.serving.triton import (
    check_parameter_keys,
    error_code,
    load_pb_utils,
    model_parameters,
    param_bool,
    param_float,
    param_int,
    param_str,
)
from trtspec.serving.triton.bls import BLSError, BLSLanguageModel, BLSTimeout, RemoteModel
from trtspec.serving.triton.health import DeploymentHealth, HealthConfig
from trtspec.serving.triton.trtllm_bls import TrtllmLanguageModel
from trtspec.spec import (
    FinishReason,
    FixedDraftLength,
    Generation,
    GenerationRequest,
    GenerationResult,
    SpeculativeDecoder,
    StopCriteria,
)

PARAMETERS = (
    "tokenizer_dir", "target_model", "draft_model", "model_backend", "vocab_size", "target_max_context", "draft_max_context",
    "max_tokens_limit", "draft_length", "max_concurrency", "apply_chat_template", "warmup", "policy_file",
    "manifest_file", "manifest_check", "trace_file", "trace_sample_rate", "max_queue", "max_text_bytes", "supervise",
    "draft_timeout_s", "draft_timeout_floor_s", "draft_timeout_max_s", "draft_timeout_multiplier",
    "draft_late_strikes", "target_timeout_s", "probe_timeout_s", "health_interval_s",
    "reload_backoff_initial_s", "reload_backoff_max_s",
)


MODEL_BACKENDS = ("python", "tensorrtllm")
MANIFEST_CHECKS = ("full", "quick", "off")


@dataclass(frozen=True)
class SpecDecodeConfig:
    tokenizer_dir: str
    vocab_size: int
    target_max_context: int
    target_model: str = "target"
    draft_model: str = ""  # empty: no draft, target alone
    model_backend: str = "python"  # python | tensorrtllm: what the draft/target models are
    draft_max_context: int = 0
    max_tokens_limit: int = 1024
    draft_length: int = 5
    max_concurrency: int = 8
    apply_chat_template: bool = True
    warmup: bool = True
    policy_file: str = ""
    manifest_file: str = ""
    manifest_check: str = "full"  # full | quick | off
    trace_file: str = ""
    trace_sample_rate: float = 0.01
    max_queue: int = 64
    max_text_bytes: int = 0  # 0: derived from target_max_context
    supervise: bool = True
    draft_timeout_s: float = 0.0
    draft_timeout_floor_s: float = 0.05
    draft_timeout_max_s: float = 2.0
    draft_timeout_multiplier: float = 4.0
    draft_late_strikes: int = 3
    target_timeout_s: float = 60.0
    probe_timeout_s: float = 30.0
    health_interval_s: float = 5.0
    reload_backoff_initial_s: float = 1.0
    reload_backoff_max_s: float = 60.0

    @property
    def text_limit_bytes(self) -> int:
        return self.max_text_bytes or max(64 * 1024, 32 * self.target_max_context)

    def health_config(self) -> HealthConfig:
        return HealthConfig(
            supervise=self.supervise,
            draft_timeout_s=self.draft_timeout_s,
            draft_timeout_floor_s=self.draft_timeout_floor_s,
            draft_timeout_max_s=self.draft_timeout_max_s,
            draft_timeout_multiplier=self.draft_timeout_multiplier,
            draft_late_strikes=self.draft_late_strikes,
            target_timeout_s=self.target_timeout_s,
            probe_timeout_s=self.probe_timeout_s,
            supervisor=SupervisorConfig(
                backoff_initial_s=self.reload_backoff_initial_s,
                backoff_max_s=self.reload_backoff_max_s,
                health_interval_s=self.health_interval_s,
            ),
        )

    @classmethod
    def from_model_config(cls, model_config: dict) -> SpecDecodeConfig:
        p = model_parameters(model_config)
        check_parameter_keys(model_config.get("name") or SPEC_DECODE, p, PARAMETERS)
        missing = [k for k in ("tokenizer_dir", "vocab_size", "target_max_context") if not p.get(k)]
        if missing:
            raise ValueError(f"spec_decode: model parameter(s) {', '.join(missing)} required in config.pbtxt")
        cfg = cls(
            tokenizer_dir=param_str(p, "tokenizer_dir"),
            vocab_size=param_int(p, "vocab_size", 0),
            target_max_context=param_int(p, "target_max_context", 0),
            target_model=param_str(p, "target_model", "target"),
            draft_model=param_str(p, "draft_model", ""),
            model_backend=param_str(p, "model_backend", "python"),
            draft_max_context=param_int(p, "draft_max_context", 0),
            max_tokens_limit=param_int(p, "max_tokens_limit", 1024),
            draft_length=param_int(p, "draft_length", 5),
            max_concurrency=param_int(p, "max_concurrency", 8),
            apply_chat_template=param_bool(p, "apply_chat_template", True),
            warmup=param_bool(p, "warmup", True),
            policy_file=param_str(p, "policy_file", ""),
            manifest_file=param_str(p, "manifest_file", ""),
            manifest_check=param_str(p, "manifest_check", "full"),
            trace_file=param_str(p, "trace_file", ""),
            trace_sample_rate=param_float(p, "trace_sample_rate", 0.01),
            max_queue=param_int(p, "max_queue", 64),
            max_text_bytes=param_int(p, "max_text_bytes", 0),
            supervise=param_bool(p, "supervise", True),
            draft_timeout_s=param_float(p, "draft_timeout_s", 0.0),
            draft_timeout_floor_s=param_float(p, "draft_timeout_floor_s", 0.05),
            draft_timeout_max_s=param_float(p, "draft_timeout_max_s", 2.0),
            draft_timeout_multiplier=param_float(p, "draft_timeout_multiplier", 4.0),
            draft_late_strikes=param_int(p, "draft_late_strikes", 3),
            target_timeout_s=param_float(p, "target_timeout_s", 60.0),
            probe_timeout_s=param_float(p, "probe_timeout_s", 30.0),
            health_interval_s=param_float(p, "health_interval_s", 5.0),
            reload_backoff_initial_s=param_float(p, "reload_backoff_initial_s", 1.0),
            reload_backoff_max_s=param_float(p, "reload_backoff_max_s", 60.0),
        )
        if cfg.max_queue < 0 or cfg.max_text_bytes < 0 or cfg.probe_timeout_s <= 0:
            raise ValueError("spec_decode: max_queue >= 0, max_text_bytes >= 0, probe_timeout_s > 0 required")
        if cfg.manifest_check not in MANIFEST_CHECKS:
            raise ValueError(f"spec_decode: manifest_check must be one of {', '.join(MANIFEST_CHECKS)}, "
                             f"got {cfg.manifest_check!r}")
        if cfg.model_backend not in MODEL_BACKENDS:
            raise ValueError(f"spec_decode: model_backend must be one of {', '.join(MODEL_BACKENDS)}, "
                             f"got {cfg.model_backend!r}")
        if cfg.draft_model and cfg.draft_max_context <= 0:
            raise ValueError("spec_decode: draft_max_context is required with a draft_model")
        if cfg.draft_length < 0 or cfg.max_concurrency < 1 or cfg.max_tokens_limit < 1:
            raise ValueError("spec_decode: draft_length >= 0, max_concurrency >= 1, max_tokens_limit >= 1 required")
        return cfg


def load_governor(config: SpecDecodeConfig, listeners: list) -> SpeculationGovernor:
    """The deployment's control plane: the policy file (or the built-in policy), ``k_max``
    capped at the build's ``draft_length``; no draft deployed -> nobody speculates."""
    policy = load_policy(config.policy_file) if config.policy_file else Policy()
    dl = policy.draft_length
    if config.draft_length < dl.k_max:
        policy = policy.model_copy(update={"draft_length": dl.model_copy(update={"k_max": max(1, config.draft_length)})})
    governor = SpeculationGovernor(policy, clock=time.monotonic, breaker_listeners=listeners)
    if not config.draft_model or config.draft_length == 0:
        governor.set_draft_available(False)
    return governor


def request_info(request: ServeRequest, prompt_len: int, max_new_tokens: int, has_draft: bool) -> RequestInfo:
    """What routing needs to know; ``speculation: on`` without a draft is the client's error."""
    if request.speculation is Speculation.on and not has_draft:
        raise InvalidRequestError("speculation 'on' needs a draft model; this deployment serves the target alone")
    return RequestInfo(
        request_id=request.request_id,
        context_tokens=prompt_len,
        max_new_tokens=max_new_tokens,
        priority=Priority(request.priority),
        speculation=ControlSpeculation(request.speculation.value),
    )


class _LockedTokenizer:
    """The pair's tokenizer shared by worker threads (HF fast tokenizers are not safe to call concurrently)."""

    def __init__(self, tokenizer: Any) -> None:
        self._tok = tokenizer
        self._lock = threading.Lock()

    def encode_prompt(self, text: str, raw: bool) -> list[int]:
        with self._lock:
            return self._tok.encode_prompt(text, raw=raw)

    def decode(self, token_ids: Any) -> str:
        with self._lock:
            return self._tok.decode(token_ids)

    def eos_token_ids(self) -> frozenset[int]:
        with self._lock:
            return self._tok.eos_token_ids()


class _Reply:
    """One request's response sender, guarded so the final flag goes out exactly once.

    Once the final flag is sent the sender's ``is_cancelled()`` must not be
    called: it reads the freed response factory and crashes the whole server
    (seen on Triton 2.51). ``send`` after the final flag is refused by the stub
    itself, so a final send that failed can still be followed by an error.
    """

    def __init__(self, pb: Any, sender: Any) -> None:
        self._pb = pb
        self._sender = sender
        self.final_sent = False
        self._final_failed = False

    def is_cancelled(self) -> bool:
        return not self.final_sent and bool(self._sender.is_cancelled())

    def send_text(self, text: str) -> None:
        assert not self.final_sent, "send after the final flag"
        self._sender.send(self._pb.InferenceResponse(output_tensors=[_text_tensor(self._pb, text)]))

    def send_final(self, outputs: list) -> None:
        assert not self.final_sent, "final flag sent twice"
        self.final_sent = True
        pb = self._pb
        try:
            self._sender.send(pb.InferenceResponse(output_tensors=outputs), flags=pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        except Exception:
            self._final_failed = True
            raise

    def send_error(self, message: str, code: str) -> None:
        """The error and the final flag, in one response; a client that went away is not our error."""
        if self.final_sent and not self._final_failed:
            return
        self.final_sent = True
        self._final_failed = False
        pb = self._pb
        response = pb.InferenceResponse(output_tensors=[], error=pb.TritonError(message, error_code(pb, code)))
        try:
            self._sender.send(response, flags=pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        except Exception as e:
            pb.Logger.log_warn(f"trtspec spec_decode: could not send '{message}': {_one_line(e)}")


class TritonPythonModel:
    """``spec_decode``: see the module docstring."""

    def __init__(self, pb: Any = None) -> None:
        self._pb_override = pb
        self.pb: Any = None
        self.config: SpecDecodeConfig | None = None
        self.decoder: SpeculativeDecoder | None = None
        self.target_only: SpeculativeDecoder | None = None
        self.tokenizer: _LockedTokenizer | None = None
        self.metrics: SpecMetrics | None = None
        self.governor: SpeculationGovernor | None = None
        self.outcomes: Counter[str] = Counter()  # requests by outcome (also on the metrics port)
        self.warmup_s: float | None = None
        self._pool: ThreadPoolExecutor | None = None
        self.health: DeploymentHealth | None = None
        self._closing = False
        self._eos: frozenset[int] = frozenset()
        self._in_flight = 0  # accepted requests not finished yet (queued for a worker or running)
        self._in_flight_lock = threading.Lock()

    # -- Triton entry points -------------------------------------------------

    def initialize(self, args: dict) -> None:
        from trtspec.runtime.tokenizer import Tokenizer

        pb = self.pb = load_pb_utils(self._pb_override)
        # This process's tensor work is a few small ops per iteration (argmax or softmax over
        # k + 1 rows): one thread, so no OpenMP team of ours wakes or spins beside the models.
        # (Only in a stub of our own: in-process tests must not change their host's threads.)
        if self._pb_override is None:
            torch.set_num_threads(1)
        model_config = json.loads(args["model_config"])
        if not pb.using_decoupled_model_transaction_policy(model_config):
            raise ValueError("spec_decode must be decoupled (model_transaction_policy { decoupled: true })")
        cfg = self.config = SpecDecodeConfig.from_model_config(model_config)
        self._check_engines(cfg)
        self.tokenizer = _LockedTokenizer(Tokenizer.from_dir(cfg.tokenizer_dir))
        self._eos = self.tokenizer.eos_token_ids()
        name = args.get("model_name") or SPEC_DECODE
        tracer = (
            RejectionTracer(cfg.trace_file, cfg.trace_sample_rate, detokenizer=self.tokenizer) if cfg.trace_file else None
        )
        self.metrics = SpecMetrics(TritonMetricSink(pb), model=name, tracer=tracer)
        self.governor = load_governor(cfg, [self.metrics])
        # Every BLS call runs on a pool under a deadline: a worker's calls, a late call
        # left to finish, a draft release, a probe.
        health = self.health = DeploymentHealth(
            pb, cfg.health_config(), self.governor, model_name=name,
            pool_size=2 * cfg.max_concurrency + 2, extra_status=self._request_status,
        )
        target_lm, draft_lm = self._remote_models(cfg)
        target = health.guard_target(target_lm)
        draft = health.guard_draft(draft_lm) if draft_lm is not None else None
        self.decoder = SpeculativeDecoder(target, draft, detokenizer=self.tokenizer)
        self.target_only = SpeculativeDecoder(target, None, detokenizer=self.tokenizer)
        self._pool = ThreadPoolExecutor(max_workers=cfg.max_concurrency, thread_name_prefix="spec_decode")
        if cfg.warmup:
            self.warmup_s = self.warm_up()
        health.start()
        pb.Logger.log_info(
            f"trtspec spec_decode: target '{cfg.target_model}', draft '{cfg.draft_model or '-'}', "
            f"policy {cfg.policy_file or 'built-in'} ({self.governor.policy.draft_length.controller.value}, "
            f"k_max {self.governor.policy.draft_length.k_max}), "
            f"{cfg.max_concurrency} workers, warm-up {self.warmup_s if self.warmup_s is not None else 'off'}"
        )

    @staticmethod
    def _check_engines(cfg: SpecDecodeConfig) -> None:
        """Refuse to load (one line naming every difference) engines built for something else than
        what this server runs: another backend, trtspec/torch/TensorRT-LLM version or GPU, or files
        changed since the build (:func:`trtspec.build.manifest.verify_engines`)."""
        if not cfg.manifest_file or cfg.manifest_check == "off":
            return
        from trtspec.build.manifest import verify_engines

        backend = "trtllm" if cfg.model_backend == "tensorrtllm" else "torch"
        verify_engines(Path(cfg.manifest_file).parent, backend, verify_hashes=cfg.manifest_check == "full")

    def _remote_models(self, cfg: SpecDecodeConfig) -> tuple[RemoteModel, RemoteModel | None]:
        """The target and (with one) the draft, as the language models the loop drives."""
        pb = self.pb
        if cfg.model_backend == "tensorrtllm":  # engines: tokens in, tokens out; the target verifies
            target: RemoteModel = TrtllmLanguageModel(pb, cfg.target_model, cfg.vocab_size, cfg.target_max_context)
            draft = (TrtllmLanguageModel(pb, cfg.draft_model, cfg.vocab_size, cfg.draft_max_context)
                     if cfg.draft_model else None)
            return target, draft
        share = self.cpu_share if cfg.draft_model else None
        target = BLSLanguageModel(pb, cfg.target_model, cfg.vocab_size, cfg.target_max_context, cpu_share=share)
        draft = (BLSLanguageModel(pb, cfg.draft_model, cfg.vocab_size, cfg.draft_max_context, cpu_share=share)
                 if cfg.draft_model else None)
        return target, draft

    def execute(self, requests: list) -> None:
        pb = self.pb
        assert self.config is not None and self._pool is not None
        for request in requests:
            reply = _Reply(pb, request.get_response_sender())
            try:
                sreq = parse_request(
                    _lookup(request),
                    max_tokens_limit=self.config.max_tokens_limit,
                    request_id=request.request_id(),
                    max_text_bytes=self.config.text_limit_bytes,
                )
            except InvalidRequestError as e:
                reply.send_error(str(e), "INVALID_ARG")
                self._observe("invalid", None)
                continue
            except Exception as e:  # a parser bug must not take the batch down
                pb.Logger.log_error(f"trtspec spec_decode: {traceback.format_exc()}")
                reply.send_error(f"internal error: {type(e).__name__}", "INTERNAL")
                self._observe("error", None)
                continue
            # Load shedding: beyond max_concurrency running and max_queue waiting, refuse at once
            # with a clear error rather than let the client time out.
            limit = self.config.max_concurrency + self.config.max_queue
            with self._in_flight_lock:
                busy = self._in_flight >= limit
                if not busy:
                    self._in_flight += 1
            if busy:
                reply.send_error(f"server busy: {limit} requests in flight; unavailable, retry later", "UNAVAILABLE")
                self._observe("unavailable", None)
                continue
            # The worker gets the sender only, not the request: inputs are read here,
            # while the request is certainly alive.
            try:
                self._pool.submit(self._serve, reply, sreq)
            except RuntimeError:  # the pool is shut down: the model is being unloaded
                self._done_in_flight()
                reply.send_error("the server is shutting down", "UNAVAILABLE")
                self._observe("unavailable", None)
        return None

    def finalize(self) -> None:
        self._closing = True  # running loops stop at their next iteration
        if self._pool is not None:
            self._pool.shutdown(wait=True)
        if self.health is not None:
            self.health.stop()

    def cpu_share(self) -> int:
        """How many of the models compute at the same time, sent with every draft/target call.

        One request at a time: draft and target take turns (1), each may use all its
        threads. Several requests with at least one speculating: the draft works while
        the target verifies another request (2), so each runs half its threads. Demo
        pair, 2 cores, 4 concurrent requests: with two threads each and OpenMP threads
        spinning briefly, the models slowed each other until the controller stopped
        speculating (0.83-0.88x of speculation off); one thread each gave 1.89-2.06x.
        """
        governor = self.governor
        if self._in_flight < 2 or governor is None or governor.admission.active == 0:
            return 1
        return 2

    def _done_in_flight(self) -> None:
        with self._in_flight_lock:
            self._in_flight -= 1

    def _request_status(self) -> dict:
        """The request side of the status file."""
        return {"requests": {"in_flight": self._in_flight, "outcomes": dict(self.outcomes)}}

    # -- one request, on a worker thread -------------------------------------

    def _serve(self, reply: _Reply, sreq: ServeRequest) -> None:
        pb = self.pb
        assert self.decoder is not None and self.target_only is not None and self.config is not None
        assert self.tokenizer is not None and self.governor is not None and self.metrics is not None
        result: GenerationResult | None = None
        outcome = "error"
        control: RequestControl | None = None
        gen: Generation | None = None
        timer = TokenTimer()
        try:
            if self._closing:
                outcome = "unavailable"
                reply.send_error("the server is shutting down", "UNAVAILABLE")
                return
            refusal = self.health.target_refusal() if self.health is not None else None
            if refusal is not None:  # the target is known down: fail fast, never hang
                outcome = "unavailable"
                reply.send_error(refusal, "UNAVAILABLE")
                return
            prompt = self.tokenizer.encode_prompt(sreq.text, raw=not self.config.apply_chat_template)
            gen_request = GenerationRequest(
                prompt_ids=tuple(prompt),
                stop=StopCriteria(max_new_tokens=sreq.max_tokens, eos_token_ids=self._eos, stop_strings=sreq.stop_words),
                sampling=sreq.sampling,
                request_id=sreq.request_id,
            )
            info = request_info(sreq, len(prompt), sreq.max_tokens, bool(self.config.draft_model))
            control = self.governor.decide(info)
            self.metrics.request_started(control.speculate, control.reason)
            decoder = self.decoder if control.speculate else self.target_only
            gen = decoder.stream(
                gen_request,
                self.metrics.wrap_policy(control, sreq.request_id),
                cancelled=lambda: self._closing or reply.is_cancelled(),
            )
            for chunk in gen:
                timer.tokens(len(chunk.token_ids))
                if sreq.stream and chunk.text:
                    reply.send_text(chunk.text)
            result = gen.result
            if result.stats.draft_errors:
                what = "was late" if isinstance(gen.draft_error, BLSTimeout) else "failed"
                pb.Logger.log_warn(
                    f"trtspec spec_decode request {sreq.request_id!r}: draft {what} "
                    f"({_one_line(gen.draft_error)}); finished on the target alone"
                )
            if result.finish_reason is FinishReason.CANCELLED:
                if self._closing:
                    outcome = "unavailable"
                    reply.send_error("the server is shutting down", "UNAVAILABLE")
                else:
                    outcome = "cancelled"
                    reply.send_error("request cancelled by the client", "CANCELLED")
                return
            reply.send_final(self._final_outputs("" if sreq.stream else result.text, result, len(prompt)))
            outcome = "ok"
        except InvalidRequestError as e:
            outcome = "invalid"
            reply.send_error(str(e), "INVALID_ARG")
        except BLSError as e:
            outcome = "unavailable"
            reply.send_error(str(e), "UNAVAILABLE")
        except Exception as e:
            if _quietly(reply.is_cancelled):  # sending failed because the client went away
                outcome = "cancelled"
                reply.send_error("request cancelled by the client", "CANCELLED")
            else:
                pb.Logger.log_error(f"trtspec spec_decode request {sreq.request_id!r}: {traceback.format_exc()}")
                reply.send_error(f"internal error: {type(e).__name__}: {_one_line(e)}", "INTERNAL")
        finally:
            self._done_in_flight()
            self._finish(outcome, control, gen, timer)

    def _final_outputs(self, text: str, result: GenerationResult, num_input_tokens: int) -> list:
        """The final response's outputs, batch-first (``[1, ...]``) as ``max_batch_size > 0`` implies."""
        pb = self.pb
        s = result.stats
        rate = s.acceptance_rate

        def one(name: str, value: object, dtype: type) -> Any:
            return pb.Tensor(name, np.array([[value]], dtype=dtype))

        return [
            _text_tensor(pb, text),
            one("finish_reason", result.finish_reason.value.encode(), np.object_),
            one("num_input_tokens", num_input_tokens, np.int32),
            one("num_output_tokens", s.emitted_tokens, np.int32),
            one("num_draft_tokens", s.drafted_tokens, np.int32),
            one("num_accepted_tokens", s.accepted_tokens, np.int32),
            one("acceptance_rate", rate if rate is not None else 0.0, np.float32),
            pb.Tensor("output_ids", np.array([result.token_ids], dtype=np.int64).reshape(1, -1)),
        ]

    def _finish(self, outcome: str, control: RequestControl | None, gen: Generation | None, timer: TokenTimer) -> None:
        """Release the request's control-plane slot and record its outcome; never raises."""
        self.outcomes[outcome] += 1
        try:
            if control is not None:
                control.finish()
            if self.metrics is None:
                return
            if control is None:
                self.metrics.request_refused(outcome)
                return
            self.metrics.request_finished(
                gen.stats if gen is not None else None,
                speculating=control.speculate,
                outcome=outcome,
                ttft_s=timer.ttft_s,
                itl_s=timer.itl_s,
                latency_s=timer.elapsed_s(),
                fallbacks=control.fallback.fallbacks,
            )
            if self.governor is not None:
                self.metrics.set_gauges(self.governor.snapshot())
        except Exception as e:
            self.pb.Logger.log_warn(f"trtspec spec_decode: metrics update failed: {_one_line(e)}")

    def _observe(self, outcome: str, result: GenerationResult | None) -> None:
        """A request refused before it reached a worker (invalid input, shutting down)."""
        self.outcomes[outcome] += 1
        if self.metrics is not None:
            self.metrics.request_refused(outcome)

    # -- warm-up -----------------------------------------------------------------

    def warm_up(self) -> float:
        """Run the tokenizer and the whole loop (greedy and sampled, k drafts) on in-process dummy models.

        Pays torch's and the tokenizer's lazy initialisation in this process;
        the draft and target models warm themselves.
        """
        assert self.config is not None and self.tokenizer is not None
        t0 = time.perf_counter()
        cfg = self.config
        prompt = self.tokenizer.encode_prompt("Hello world", raw=not cfg.apply_chat_template) or [0]
        self.tokenizer.decode(prompt)
        ctx = cfg.target_max_context
        dummy = SpeculativeDecoder(_DummyLM(cfg.vocab_size, ctx), _DummyLM(cfg.vocab_size, ctx), self.tokenizer)
        from trtspec.spec import SamplingParams

        prompt = tuple(prompt[: max(1, ctx - 8)])
        for sampling in (SamplingParams(), SamplingParams(temperature=0.8, top_k=50, top_p=0.9, seed=0)):
            req = GenerationRequest(prompt, StopCriteria(max_new_tokens=min(4, ctx - len(prompt))), sampling)
            dummy.generate(req, FixedDraftLength(max(1, cfg.draft_length)))
        return time.perf_counter() - t0


class _DummyLM:
    """Deterministic random logits; for warm-up only."""

    def __init__(self, vocab_size: int, max_context: int) -> None:
        self.vocab_size = vocab_size
        self.max_context = max_context

    def new_session(self, session_id: str = "") -> _DummySession:
        return _DummySession(self.vocab_size)


class _DummySession:
    def __init__(self, vocab: int) -> None:
        self._vocab = vocab
        self.num_cached = 0
        self._gen = torch.Generator().manual_seed(0)

    def forward(self, token_ids: Any, num_logits: int) -> torch.Tensor:
        self.num_cached += len(token_ids)
        return torch.randn((num_logits, self._vocab), generator=self._gen)

    def truncate(self, length: int) -> None:
        self.num_cached = length

    def close(self) -> None:
        pass


def _lookup(request: Any) -> Any:
    """``name -> value``: the input tensor, else the request parameter (Triton's ``generate`` puts ``parameters`` there)."""
    params: dict | None = None

    def get(name: str) -> Any:
        nonlocal params
        for t in request.inputs():
            if t.name() == name:
                return t.as_numpy()
        if params is None:
            raw = request.parameters()
            try:
                params = json.loads(raw) if isinstance(raw, str) and raw else (raw if isinstance(raw, dict) else {})
            except (json.JSONDecodeError, RecursionError):
                params = {}
            if not isinstance(params, dict):
                params = {}
        return params.get(name)

    return get


def _text_tensor(pb: Any, text: str) -> Any:
    return pb.Tensor("text_output", np.array([[text.encode("utf-8")]], dtype=np.object_))  # [batch 1, 1]


def _quietly(check: Any) -> bool:
    try:
        return bool(check())
    except Exception:
        return False


def _one_line(e: object) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__
