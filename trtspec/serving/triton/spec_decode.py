"""The ``spec_decode`` model: the Triton adapter of :class:`~trtspec.serving.service.RequestService`.

Decoupled. ``initialize`` reads the parameters (:class:`~trtspec.wire.SpecDecodeParams`,
table in docs/serving.md), builds the BLS proxies of the ``draft`` and ``target``
models (:mod:`.bls`, or :mod:`.trtllm_bls` for TensorRT-LLM engines) under
:class:`~.health.DeploymentHealth` (deadlines, supervision, status file), and
starts the service. ``execute`` hands each request of the batch to the service
with a reply that turns its answers into Triton responses; the service parses,
sheds load, decodes on its worker threads and answers (errors: one line, with
the Triton code the service names; the final flag exactly once per request).
This is the only file of ``spec_decode`` that touches ``pb_utils``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from trtspec.decoding import GenerationResult, StreamChunk
from trtspec.decoding.types import TopLogprobs
from trtspec.errors import one_line
from trtspec.obs import QueuedSink, TritonMetricSink
from trtspec.serving.request import Lookup
from trtspec.serving.service import RequestService
from trtspec.serving.triton import error_code, load_pb_utils, model_parameters
from trtspec.serving.triton.bls import BLSLanguageModel, RemoteModel
from trtspec.serving.triton.health import DeploymentHealth, HealthConfig
from trtspec.serving.triton.trtllm_bls import TrtllmLanguageModel
from trtspec.wire import SPEC_DECODE, SpecDecodeParams, top_arrays


class TritonPythonModel:
    """``spec_decode``: see the module docstring."""

    def __init__(self, pb: Any = None) -> None:
        self._pb_override = pb
        self.pb: Any = None
        self.service: RequestService | None = None
        self.health: DeploymentHealth | None = None
        self.warmup_s: float | None = None
        self._metrics: QueuedSink | None = None

    def initialize(self, args: dict) -> None:
        from trtspec.builder.manifest import check_served_engines
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
        name = args.get("model_name") or SPEC_DECODE
        cfg = SpecDecodeParams.from_parameters(model_parameters(model_config), model_config.get("name") or name)
        check_served_engines(cfg.manifest_file, cfg.model_backend, cfg.manifest_check)
        self._metrics = QueuedSink(TritonMetricSink(pb))  # each metric call is a round trip to the server
        service = self.service = RequestService(
            cfg, Tokenizer.from_dir(cfg.tokenizer_dir), self._metrics, model=name, log=pb.Logger
        )
        # Every BLS call runs on a pool under a deadline: a worker's calls, a late call
        # left to finish, a draft release, a probe.
        health = self.health = DeploymentHealth(
            pb, HealthConfig.from_params(cfg), service.governor, model_name=name,
            pool_size=2 * cfg.max_concurrency + 2, extra_status=service.status,
        )
        target, draft = self._remote_models(cfg)
        # An engine cannot be fed a pass without logits: no chunked prefill there.
        guarded = health.guard_target(target, prefill_chunk=0 if cfg.model_backend == "tensorrtllm" else None)
        service.start(guarded, health.guard_draft(draft) if draft is not None else None,
                      target_refusal=health.target_refusal, write_status=health.write_status)
        if cfg.warmup:
            self.warmup_s = service.warm_up()
        health.start()
        dl = service.governor.policy.draft_length
        pb.Logger.log_info(
            f"trtspec spec_decode: target '{cfg.target_model}', draft '{cfg.draft_model or '-'}', "
            f"policy {cfg.policy_file or 'built-in'} ({dl.controller.value}, k_max {dl.k_max}), "
            f"{cfg.max_concurrency} workers, warm-up {self.warmup_s if self.warmup_s is not None else 'off'}"
        )

    def _remote_models(self, cfg: SpecDecodeParams) -> tuple[RemoteModel, RemoteModel | None]:
        """The target and (with one) the draft, as the language models the loop drives."""
        pb = self.pb
        if cfg.model_backend == "tensorrtllm":  # engines: tokens in, tokens out; the target verifies
            target: RemoteModel = TrtllmLanguageModel(pb, cfg.target_model, cfg.vocab_size, cfg.target_max_context)
            draft = (TrtllmLanguageModel(pb, cfg.draft_model, cfg.vocab_size, cfg.draft_max_context)
                     if cfg.draft_model else None)
            return target, draft
        assert self.service is not None
        share = self.service.cpu_share if cfg.draft_model else None
        target = BLSLanguageModel(pb, cfg.target_model, cfg.vocab_size, cfg.target_max_context, cpu_share=share)
        draft = (BLSLanguageModel(pb, cfg.draft_model, cfg.vocab_size, cfg.draft_max_context, cpu_share=share)
                 if cfg.draft_model else None)
        return target, draft

    def execute(self, requests: list) -> None:
        assert self.service is not None
        for request in requests:
            # The worker gets the sender only, not the request: inputs are read here,
            # while the request is certainly alive.
            self.service.submit(_Reply(self.pb, request.get_response_sender()), _lookup(request), request.request_id())
        return None

    def finalize(self) -> None:
        if self.service is not None:
            self.service.close()
        if self.health is not None:
            self.health.stop()
        if self._metrics is not None:
            self._metrics.close()


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

    def send_text(self, text: str, tokens: StreamChunk | None = None) -> None:
        assert not self.final_sent, "send after the final flag"
        outputs = _text_tensors(self._pb, text)
        if tokens is not None:
            outputs += [self._pb.Tensor("output_ids", np.array([tokens.token_ids], dtype=np.int64).reshape(1, -1)),
                        *_log_prob_tensors(self._pb, tokens.logprobs, tokens.top_logprobs)]
        self._sender.send(self._pb.InferenceResponse(output_tensors=outputs))

    def send_final(self, text: str, result: GenerationResult, num_input_tokens: int) -> None:
        assert not self.final_sent, "final flag sent twice"
        self.final_sent = True
        pb = self._pb
        outputs = [*_text_tensors(pb, text), *_final_tensors(pb, result, num_input_tokens)]
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
            pb.Logger.log_warn(f"trtspec spec_decode: could not send '{message}': {one_line(e)}")


def _final_tensors(pb: Any, result: GenerationResult, num_input_tokens: int) -> list:
    """The final response's counts, batch-first (``[1, ...]``) as ``max_batch_size > 0`` implies."""
    s = result.stats
    rate = s.acceptance_rate

    def one(name: str, value: object, dtype: type) -> Any:
        return pb.Tensor(name, np.array([[value]], dtype=dtype))

    return [
        one("finish_reason", result.finish_reason.value.encode(), np.object_),
        one("num_input_tokens", num_input_tokens, np.int32),
        one("num_output_tokens", s.emitted_tokens, np.int32),
        one("num_draft_tokens", s.drafted_tokens, np.int32),
        one("num_accepted_tokens", s.accepted_tokens, np.int32),
        one("total_draft_tokens", s.drafted_tokens, np.int32),  # TensorRT-LLM's names
        one("total_accepted_draft_tokens", s.accepted_tokens, np.int32),
        one("acceptance_rate", rate if rate is not None else 0.0, np.float32),
        pb.Tensor("output_ids", np.array([result.token_ids], dtype=np.int64).reshape(1, -1)),
        *_log_prob_tensors(pb, result.logprobs, result.top_logprobs),
        *([pb.Tensor("cum_log_probs", np.array([[sum(result.logprobs)]], dtype=np.float32))]
          if result.logprobs is not None else []),  # [batch 1, beam 1]
    ]


def _log_prob_tensors(pb: Any, logprobs: Sequence[float] | None, top: Sequence[TopLogprobs] | None) -> list:
    """TensorRT-LLM's ``output_log_probs`` ``[batch 1, beam 1, tokens]`` when the request asked for them;
    with ``top``, ``top_output_ids`` and ``top_log_probs`` ``[batch 1, tokens, N]`` (wire.py)."""
    if logprobs is None:
        return []
    out = [pb.Tensor("output_log_probs", np.array(logprobs, dtype=np.float32).reshape(1, 1, -1))]
    if top:
        ids, values = top_arrays(top)
        out += [pb.Tensor("top_output_ids", ids[None]), pb.Tensor("top_log_probs", values[None])]
    return out


def _text_tensors(pb: Any, text: str) -> list:
    """What every response carries: the text, and TensorRT-LLM's batch and sequence index (one of each)."""
    return [
        pb.Tensor("text_output", np.array([[text.encode("utf-8")]], dtype=np.object_)),  # [batch 1, 1]
        pb.Tensor("batch_index", np.zeros((1, 1), dtype=np.int32)),
        pb.Tensor("sequence_index", np.zeros((1, 1), dtype=np.int32)),
    ]


def _lookup(request: Any) -> Lookup:
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
