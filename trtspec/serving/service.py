"""The ``spec_decode`` request service, without Triton: parse -> tokenize -> govern -> decode -> answer.

:class:`RequestService` is everything the ``spec_decode`` model does between
Triton's request and its responses: it reads a request through a lookup
``name -> value`` (:func:`~trtspec.serving.request.parse_request`), sheds load
beyond ``max_concurrency + max_queue``, tokenizes on a worker thread, asks the
control plane's governor (:mod:`trtspec.control`) whether and how much to
speculate, runs the :class:`~trtspec.decoding.SpeculativeDecoder`, streams the
text and sends the final counts, and records the outcome and metrics.

Answers go to a :class:`Reply` (the Triton adapter's response sender, or a
recorder in tests); errors carry a Triton error code name (:mod:`trtspec.wire`)
and a one-line message, never a traceback: a malformed request ->
``INVALID_ARG``; the client cancelled -> ``CANCELLED`` (checked every
iteration); the target failed, is known down, or too many requests wait ->
``UNAVAILABLE``; anything else -> ``INTERNAL`` (traceback in the log). A failing
or late draft is not an error: the loop goes on with the target.

While ``trtspec serve`` drains (:mod:`trtspec.serving.drain`), new requests
are refused with ``UNAVAILABLE`` (outcome ``draining``) and those in flight
past the grace period end at their next iteration (outcome ``shutdown``).
"""

from __future__ import annotations

import dataclasses
import threading
import time
import traceback
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from trtspec.control import Policy, RequestInfo, SpeculationGovernor, load_policy
from trtspec.control.governor import RequestControl
from trtspec.decoding.protocols import choose_drafter
from trtspec.decoding import (
    DraftLengthPolicy,
    DrafterKind,
    FinishReason,
    FixedDraftLength,
    Generation,
    GenerationRequest,
    GenerationResult,
    IterationOutcome,
    LanguageModel,
    LogitBias,
    SamplingParams,
    SpeculativeDecoder,
    StopCriteria,
    StreamChunk,
)
from trtspec.errors import InvalidRequestError, ModelCallError, ModelTimeoutError, one_line
from trtspec.obs import RejectionTracer, SpecMetrics, TokenTimer
from trtspec.obs.sinks import MetricSink
from trtspec.serving import statusfile
from trtspec.serving.drain import DrainWatch
from trtspec.serving.request import Lookup, ServeRequest, parse_request
from trtspec.wire import CANCELLED, INTERNAL, INVALID_ARG, UNAVAILABLE, SpecDecodeParams, Speculation

SHUTTING_DOWN = "the server is shutting down"
CLIENT_CANCELLED = "request cancelled by the client"


class Reply(Protocol):
    """Where one request's answers go; exactly one final answer (``send_final`` or ``send_error``)."""

    def is_cancelled(self) -> bool: ...

    def send_text(self, text: str, tokens: StreamChunk | None = None) -> None:
        """A streamed piece: new text; with ``tokens`` (the request asked for log-probabilities), the
        iteration's tokens and their log-probabilities."""

    def send_final(self, text: str, result: GenerationResult, num_input_tokens: int) -> None: ...

    def send_error(self, message: str, code: str) -> None: ...


class Log(Protocol):
    """The server log (Triton's ``pb_utils.Logger`` has these three)."""

    def log_info(self, message: str) -> None: ...

    def log_warn(self, message: str) -> None: ...

    def log_error(self, message: str) -> None: ...


def load_governor(config: SpecDecodeParams, listeners: list) -> SpeculationGovernor:
    """The deployment's control plane: the policy file (or the built-in policy), ``k_max``
    capped at the build's ``draft_length``; no draft model deployed -> only the free
    drafters (ngram, suffix) speculate."""
    policy = load_policy(config.policy_file) if config.policy_file else Policy()
    dl = policy.draft_length
    if config.draft_length < dl.k_max:
        policy = policy.model_copy(update={"draft_length": dl.model_copy(update={"k_max": max(1, config.draft_length)})})
    governor = SpeculationGovernor(policy, clock=time.monotonic, breaker_listeners=listeners)
    if not config.draft_model or config.draft_length == 0:
        governor.set_draft_available(False)
    return governor


def request_info(
    request: ServeRequest, prompt_len: int, max_new_tokens: int, has_draft: bool, drafter: DrafterKind
) -> RequestInfo:
    """What routing needs to know; ``speculation: on`` with the draft model, but none deployed,
    is the client's error (the free drafters need none)."""
    if request.speculation is Speculation.ON and not has_draft and drafter is DrafterKind.MODEL:
        raise InvalidRequestError("speculation 'on' with drafter 'model' needs a draft model; this deployment "
                                  "has none (drafter ngram or suffix needs none)")
    return RequestInfo(
        request_id=request.request_id,
        context_tokens=prompt_len,
        max_new_tokens=max_new_tokens,
        priority=request.priority,
        speculation=request.speculation,
        drafter=drafter,
    )


class _AtMost:
    """A draft-length policy whose ``k`` is capped per request (TensorRT-LLM's ``num_draft_tokens``)."""

    def __init__(self, policy: DraftLengthPolicy, k_max: int) -> None:
        self.policy = policy
        self.k_max = k_max

    def next_k(self) -> int:
        return min(self.policy.next_k(), self.k_max)

    @property
    def why(self) -> str | None:
        """The wrapped policy's (``RequestControl.why``), where it says."""
        return getattr(self.policy, "why", None)

    def next_drafter(self, names: Sequence[str]) -> str:
        return choose_drafter(self.policy, names)

    def observe(self, outcome: IterationOutcome) -> None:
        self.policy.observe(outcome)


def _at_most(policy: DraftLengthPolicy, k_max: int | None) -> DraftLengthPolicy:
    return policy if k_max is None else _AtMost(policy, k_max)


class LockedTokenizer:
    """The pair's tokenizer shared by worker threads (HF fast tokenizers are not safe to call concurrently)."""

    def __init__(self, tokenizer: Any) -> None:
        self._tok = tokenizer
        self._lock = threading.Lock()

    def encode_prompt(self, text: str, raw: bool) -> list[int]:
        with self._lock:
            return self._tok.encode_prompt(text, raw=raw)

    def encode_words(self, words: Any) -> tuple[tuple[int, ...], ...]:
        with self._lock:
            return self._tok.encode_words(words)

    def decode(self, token_ids: Any) -> str:
        with self._lock:
            return self._tok.decode(token_ids)

    def eos_token_ids(self) -> frozenset[int]:
        with self._lock:
            return self._tok.eos_token_ids()


@dataclass
class _Tally:
    """What one request did so far, for its outcome and metrics."""

    outcome: str = "error"
    control: RequestControl | None = None
    gen: Generation | None = None
    timer: TokenTimer = field(default_factory=TokenTimer)


class RequestService:
    """See the module docstring. ``start`` with the models, then ``submit``; ``close`` at unload."""

    def __init__(self, config: SpecDecodeParams, tokenizer: Any, sink: MetricSink, *, model: str, log: Log) -> None:
        self.config = config
        self.log = log
        self.tokenizer = LockedTokenizer(tokenizer)
        self.eos = self.tokenizer.eos_token_ids()
        tracer = RejectionTracer(config.trace_file, config.trace_sample_rate, detokenizer=self.tokenizer) \
            if config.trace_file else None
        self.metrics = SpecMetrics(sink, model=model, tracer=tracer)
        self.governor = load_governor(config, [self.metrics])
        self.outcomes: Counter[str] = Counter()  # requests by outcome (also on the metrics port)
        self.in_flight = 0  # accepted requests not finished yet (queued for a worker or running)
        self.closing = False
        self.decoder: SpeculativeDecoder | None = None
        self.target_only: SpeculativeDecoder | None = None
        self._in_flight_lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None
        self._target_refusal: Callable[[], str | None] = lambda: None
        self._write_status: Callable[[], None] = lambda: None
        self.drain = DrainWatch(statusfile.status_dir(), on_start=lambda: self._write_status())

    def start(self, target: LanguageModel, draft: LanguageModel | None,
              target_refusal: Callable[[], str | None] | None = None,
              write_status: Callable[[], None] | None = None) -> None:
        """Serve on these models; ``target_refusal``: why the target is known down (None: it is not);
        ``write_status``: write the status file now (a drain waits for it to say none in flight)."""
        if write_status is not None:
            self._write_status = write_status
        options = self.governor.policy.drafters
        self.decoder = SpeculativeDecoder(target, draft, detokenizer=self.tokenizer, drafter_options=options)
        self.target_only = SpeculativeDecoder(target, None, detokenizer=self.tokenizer)
        self._pool = ThreadPoolExecutor(max_workers=self.config.max_concurrency, thread_name_prefix="spec_decode")
        if target_refusal is not None:
            self._target_refusal = target_refusal

    def close(self) -> None:
        self.closing = True  # running loops stop at their next iteration
        if self._pool is not None:
            self._pool.shutdown(wait=True)

    def submit(self, reply: Reply, get: Lookup, request_id: str = "") -> None:
        """Read one request and queue it for a worker; a refused one is answered at once."""
        assert self._pool is not None, "start() first"
        cfg = self.config
        try:
            sreq = parse_request(get, max_tokens_limit=cfg.max_tokens_limit, request_id=request_id,
                                 max_text_bytes=cfg.text_limit_bytes,
                                 default_exact=self.governor.policy.exact)
        except InvalidRequestError as e:
            return self._refuse(reply, "invalid", str(e), INVALID_ARG)
        except Exception as e:  # a parser bug must not take the batch down
            self.log.log_error(f"trtspec spec_decode: {traceback.format_exc()}")
            return self._refuse(reply, "error", f"internal error: {type(e).__name__}", INTERNAL)
        if self.drain.draining():  # trtspec serve is shutting down: nothing new starts
            return self._refuse(reply, "draining", SHUTTING_DOWN, UNAVAILABLE)
        # Load shedding: beyond max_concurrency running and max_queue waiting, refuse at once
        # with a clear error rather than let the client time out.
        limit = cfg.max_concurrency + cfg.max_queue
        with self._in_flight_lock:
            busy = self.in_flight >= limit
            if not busy:
                self.in_flight += 1
        if busy:
            return self._refuse(reply, "unavailable", f"server busy: {limit} requests in flight; unavailable, "
                                                      "retry later", UNAVAILABLE)
        try:
            self._pool.submit(self.serve, reply, sreq)
        except RuntimeError:  # the pool is shut down: the model is being unloaded
            self._done_in_flight()
            self._refuse(reply, "unavailable", SHUTTING_DOWN, UNAVAILABLE)

    def cpu_share(self) -> int:
        """How many of the models compute at the same time, sent with every draft/target call.

        One request at a time: draft and target take turns (1), each may use all its
        threads. Several requests with at least one speculating: the draft works while
        the target verifies another request (2), so each runs half its threads (why:
        docs/serving.md, "Threads").
        """
        if self.in_flight < 2 or self.governor.admission.active == 0:
            return 1
        return 2

    def status(self) -> dict:
        """The request side of the status file."""
        return {"requests": {"in_flight": self.in_flight, "outcomes": dict(self.outcomes)}}

    # -- one request, on a worker thread -------------------------------------

    def serve(self, reply: Reply, sreq: ServeRequest) -> None:
        """Answer one parsed request; its slot and metrics are released whatever happens."""
        tally = _Tally()
        try:
            tally.outcome = self._answer(reply, sreq, tally)
        except InvalidRequestError as e:
            tally.outcome = "invalid"
            reply.send_error(str(e), INVALID_ARG)
        except ModelCallError as e:
            tally.outcome = "unavailable"
            reply.send_error(one_line(e), UNAVAILABLE)
        except Exception as e:
            if _quietly(reply.is_cancelled):  # sending failed because the client went away
                tally.outcome = "cancelled"
                reply.send_error(CLIENT_CANCELLED, CANCELLED)
            else:
                self.log.log_error(f"trtspec spec_decode request {sreq.request_id!r}: {traceback.format_exc()}")
                reply.send_error(f"internal error: {type(e).__name__}: {one_line(e)}", INTERNAL)
        finally:
            self._finish(tally)
            self._done_in_flight()  # after the outcome is counted: a drain reads both at once

    def _answer(self, reply: Reply, sreq: ServeRequest, tally: _Tally) -> str:
        """Decode ``sreq``, stream and send its final answer; the outcome."""
        assert self.decoder is not None and self.target_only is not None
        if self.closing:
            reply.send_error(SHUTTING_DOWN, UNAVAILABLE)
            return "unavailable"
        refusal = self._target_refusal()
        if refusal is not None:  # the target is known down: fail fast, never hang
            reply.send_error(refusal, UNAVAILABLE)
            return "unavailable"
        templated = self.config.apply_chat_template if sreq.apply_chat_template is None else sreq.apply_chat_template
        prompt = self.tokenizer.encode_prompt(sreq.text, raw=not templated)
        drafter = sreq.drafter or DrafterKind(self.config.default_drafter)
        info = request_info(sreq, len(prompt), sreq.max_tokens, bool(self.config.draft_model), drafter)
        control = tally.control = self.governor.decide(info)
        self.metrics.request_started(control.speculate, control.reason)
        decoder = self.decoder if control.speculate else self.target_only
        gen = tally.gen = decoder.stream(
            self._generation_request(sreq, prompt, drafter),
            self.metrics.wrap_policy(_at_most(control, sreq.max_draft_tokens), sreq.request_id),
            cancelled=lambda: self.closing or self.drain.past_grace() or reply.is_cancelled(),
        )
        for chunk in gen:
            tally.timer.tokens(len(chunk.token_ids))
            if sreq.stream and (chunk.text or (sreq.logprobs and chunk.token_ids)):
                reply.send_text(chunk.text, chunk if sreq.logprobs else None)
        result = gen.result
        if result.stats.draft_errors:
            what = "was late" if isinstance(gen.draft_error, ModelTimeoutError) else "failed"
            self.log.log_warn(f"trtspec spec_decode request {sreq.request_id!r}: draft {what} "
                              f"({one_line(gen.draft_error)}); its draft calls that failed or were late: "
                              f"{result.stats.draft_errors}, each iteration's proposal dropped, no token lost")
        if result.finish_reason is FinishReason.CANCELLED:
            if self.drain.past_grace():
                reply.send_error(f"the server shut down before this request finished (grace period of "
                                 f"{self.drain.grace_period_s():g}s over); retry", UNAVAILABLE)
                return "shutdown"
            if self.closing:
                reply.send_error(SHUTTING_DOWN, UNAVAILABLE)
                return "unavailable"
            reply.send_error(CLIENT_CANCELLED, CANCELLED)
            return "cancelled"
        text = "" if sreq.stream else (sreq.text + result.text if sreq.echo_prompt else result.text)
        reply.send_final(text, result, len(prompt))
        return "ok"

    def _generation_request(self, sreq: ServeRequest, prompt: list[int], drafter: DrafterKind) -> GenerationRequest:
        eos = self.eos
        if sreq.end_id is not None:  # TensorRT-LLM's end_id replaces the tokenizer's EOS; -1: none
            if sreq.end_id >= self.config.vocab_size:
                raise InvalidRequestError(f"end_id {sreq.end_id} is not a token id (vocabulary: {self.config.vocab_size})")
            eos = frozenset() if sreq.end_id == -1 else frozenset({sreq.end_id})
        return GenerationRequest(
            prompt_ids=tuple(prompt),
            stop=StopCriteria(max_new_tokens=sreq.max_tokens, eos_token_ids=eos, stop_strings=sreq.stop_words,
                              min_new_tokens=sreq.min_tokens),
            sampling=self._with_bias_words(sreq),
            request_id=sreq.request_id,
            drafter=drafter,
            bad_words=self.tokenizer.encode_words(sreq.bad_words),
            logprobs=sreq.logprobs,
            top_logprobs=sreq.top_logprobs,
        )

    def _with_bias_words(self, sreq: ServeRequest) -> SamplingParams:
        """The request's sampling, its embedding bias words' tokens in its logit bias (each token of a
        word gets the word's weight, as TensorRT-LLM's preprocessing adds it)."""
        if not sreq.bias_words:
            return sreq.sampling
        pairs = [(t, weight) for word, weight in sreq.bias_words for ids in self.tokenizer.encode_words([word])
                 for t in ids]
        bias = sreq.sampling.logit_bias
        return dataclasses.replace(sreq.sampling, logit_bias=LogitBias.of([*zip(bias.ids, bias.values), *pairs]))

    def _done_in_flight(self) -> None:
        with self._in_flight_lock:
            self.in_flight -= 1
            last = self.in_flight == 0
        if last and self.drain.draining():
            self._write_status()  # the launcher waits for this to stop the server

    def _refuse(self, reply: Reply, outcome: str, message: str, code: str) -> None:
        """A request answered before it reached a worker (invalid input, busy, shutting down)."""
        reply.send_error(message, code)
        self.outcomes[outcome] += 1
        self.metrics.request_refused(outcome)

    def _finish(self, tally: _Tally) -> None:
        """Release the request's control-plane slot and record its outcome; never raises."""
        self.outcomes[tally.outcome] += 1
        control, gen, timer = tally.control, tally.gen, tally.timer
        try:
            if control is None:
                self.metrics.request_refused(tally.outcome)
                return
            control.finish()
            self.metrics.request_finished(
                gen.stats if gen is not None else None,
                speculating=control.speculate,
                outcome=tally.outcome,
                ttft_s=timer.ttft_s,
                itl_s=timer.itl_s,
                latency_s=timer.elapsed_s(),
                fallbacks=control.fallback.fallbacks,
            )
            self.metrics.set_gauges(self.governor.snapshot())
        except Exception as e:
            self.log.log_warn(f"trtspec spec_decode: metrics update failed: {one_line(e)}")

    # -- warm-up -----------------------------------------------------------------

    def warm_up(self) -> float:
        """Run the tokenizer and the whole loop (greedy and sampled, k drafts) on in-process dummy
        models; the seconds it took. Pays torch's and the tokenizer's lazy initialisation in this
        process; the draft and target models warm themselves."""
        t0 = time.perf_counter()
        cfg = self.config
        prompt = self.tokenizer.encode_prompt("Hello world", raw=not cfg.apply_chat_template) or [0]
        self.tokenizer.decode(prompt)
        ctx = cfg.target_max_context
        dummy = SpeculativeDecoder(_DummyLM(cfg.vocab_size, ctx), _DummyLM(cfg.vocab_size, ctx), self.tokenizer)
        prompt = prompt[: max(1, ctx - 8)]
        for sampling in (SamplingParams(), SamplingParams(temperature=0.8, top_k=50, top_p=0.9, seed=0)):
            req = GenerationRequest(tuple(prompt), StopCriteria(max_new_tokens=min(4, ctx - len(prompt))), sampling)
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


def _quietly(check: Callable[[], Any]) -> bool:
    try:
        return bool(check())
    except Exception:
        return False
