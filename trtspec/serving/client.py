"""Client side of the ``spec_decode`` interface: gRPC streaming and Triton's HTTP generate endpoints.

- gRPC: ``tritonclient.grpc`` bidirectional stream (``start_stream`` /
  ``async_stream_infer``); the only way to reach a decoupled model over gRPC.
  Cancelling (``cancel`` event) closes the stream with ``cancel_requests=True``,
  which the server sees as a cancelled request.
- HTTP: ``POST /v2/models/spec_decode/generate`` (one JSON object) or
  ``generate_stream`` (server-sent events, one per response); plain ``urllib``.

Both return a :class:`ClientResult`: the text, the per-request counts the final
response carries, time to first token and total time as the client saw them.
Errors the server answers become :class:`ClientError` with its one-line message.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import queue
import re
import threading
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from trtspec.decoding.types import LogitBias, Penalties
from trtspec.errors import TrtspecError, one_line
from trtspec.wire import SPEC_DECODE, SPEC_DECODE_INPUTS, top_pairs

OnText = Callable[[str], None]


class ClientError(TrtspecError):
    """The server answered an error (or could not be reached)."""

    def __init__(self, message: str, code: str | None = None, http_status: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.code = code  # INVALID_ARG, UNAVAILABLE, ... when the transport says
        self.http_status = http_status


@dataclass(frozen=True)
class GenerateParams:
    """The optional inputs of one request; None leaves the server's default."""

    max_tokens: int = 128
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    seed: int | None = None
    stop_words: Sequence[str] = ()
    bad_words: Sequence[str] = ()  # words the text never contains
    speculation: str | None = None  # auto | on | off
    priority: str | None = None  # high | normal | low
    apply_chat_template: bool | None = None  # False: the prompt is already rendered
    drafter: str | None = None  # model | ngram | suffix | auto
    end_id: int | None = None  # the only EOS token; -1: none, the answer runs to max_tokens (None: the tokenizer's)
    min_tokens: int | None = None  # no EOS among the first this many tokens
    penalties: Penalties = Penalties()  # TensorRT-LLM's repetition, presence and frequency penalties
    logit_bias: LogitBias = LogitBias()  # values added to some ids' logits (OpenAI's logit_bias)
    logprobs: bool = False  # return_log_probs: each output token's log-probability
    top_logprobs: int = 0  # with logprobs: the most likely tokens at each position too

    def fields(self) -> dict[str, Any]:
        """Input name -> value, for the inputs this request sets."""
        out: dict[str, Any] = {"max_tokens": int(self.max_tokens)}
        for name in ("temperature", "top_k", "top_p", "seed", "speculation", "priority", "apply_chat_template",
                     "drafter", "end_id", "min_tokens"):
            v = getattr(self, name)
            if v is not None:
                out[name] = v
        for name in ("stop_words", "bad_words"):
            if getattr(self, name):
                out[name] = list(getattr(self, name))
        if not self.penalties.neutral:
            out.update(self.penalties.inputs())
        if not self.logit_bias.neutral:
            out.update(logit_bias_ids=list(self.logit_bias.ids), logit_bias_values=list(self.logit_bias.values))
        if self.logprobs:
            out["return_log_probs"] = True
        if self.top_logprobs:
            out["top_logprobs"] = int(self.top_logprobs)
        return out


@dataclass
class ClientResult:
    text: str
    finish_reason: str | None
    num_input_tokens: int = 0
    num_output_tokens: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    acceptance_rate: float | None = None  # None when nothing was drafted
    ttft_s: float | None = None  # request sent -> first text received
    total_s: float = 0.0
    protocol: str = "grpc"
    chunks: list[str] = field(default_factory=list)
    output_ids: list[int] = field(default_factory=list)
    logprobs: list[float] | None = None  # [len(output_ids)], when the request asked for them
    top_logprobs: list[list[tuple[int, float]]] | None = None  # [len(output_ids)]: (id, logprob), best first

    @property
    def tokens_per_s(self) -> float:
        return self.num_output_tokens / self.total_s if self.total_s > 0 else 0.0

    def to_dict(self) -> dict:
        d = asdict(self)
        d["tokens_per_s"] = self.tokens_per_s
        return d


def parse_url(url: str) -> tuple[str, int]:
    """``HOST:PORT``, optionally with ``http://`` or ``grpc://``, as (host, port)."""
    rest = url.split("://", 1)[-1].rstrip("/")
    host, sep, port = rest.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ClientError(f"server address must be HOST:PORT, got {url!r}")
    return host, int(port)


def generate(
    url: str,
    prompt: str,
    params: GenerateParams = GenerateParams(),
    *,
    http: bool = False,
    stream: bool = True,
    on_text: OnText | None = None,
    cancel: threading.Event | None = None,
    timeout_s: float = 600.0,
    model: str = SPEC_DECODE,
) -> ClientResult:
    """One request over gRPC (default) or HTTP (``http=True``)."""
    if http:
        return generate_http(url, prompt, params, stream=stream, on_text=on_text, timeout_s=timeout_s, model=model)
    return generate_grpc(
        url, prompt, params, stream=stream, on_text=on_text, cancel=cancel, timeout_s=timeout_s, model=model
    )


# -- gRPC ------------------------------------------------------------------------------

_INPUT_TYPES = {spec.name: spec.data_type for spec in SPEC_DECODE_INPUTS}  # name -> TYPE_INT32, ...


def grpc_inputs(values: Mapping[str, Any]) -> list:
    """``tritonclient.grpc.InferInput``s for ``values`` (shape ``[1, n]``: batch of one)."""
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import triton_to_np_dtype

    inputs = []
    for name, value in values.items():
        config_type = _INPUT_TYPES[name]  # the model config's type; the wire's: TYPE_STRING is BYTES
        triton_type = "BYTES" if config_type == "TYPE_STRING" else config_type.removeprefix("TYPE_")
        dtype = triton_to_np_dtype(triton_type)
        arr = np.array([_wire_items(name, _as_list(value), dtype)], dtype=dtype)  # [1, n]
        inp = grpcclient.InferInput(name, list(arr.shape), triton_type)
        inp.set_data_from_numpy(arr)
        inputs.append(inp)
    return inputs


def _check_http_values(values: Mapping[str, Any]) -> None:
    """What :func:`_wire_items` refuses, for Triton's HTTP generate (JSON): its integers (Triton wraps
    one beyond its input's type as numpy does); text it refuses itself, naming the input."""
    from tritonclient.utils import triton_to_np_dtype

    for name, value in values.items():
        dtype = triton_to_np_dtype(_INPUT_TYPES[name].removeprefix("TYPE_"))
        if dtype is not None and np.issubdtype(dtype, np.integer):
            _wire_items(name, _as_list(value), dtype)


def _as_list(value: Any) -> list:
    return list(value) if isinstance(value, (list, tuple)) else [value]


def _wire_items(name: str, items: list, dtype: Any) -> list:
    """``items`` as input ``name`` carries them: text as UTF-8, integers within ``dtype``'s range (numpy
    would wrap 10**12 into an int32 the server then misreads). A value that cannot be is the caller's
    error, a :class:`ClientError` naming the input, raised before anything is sent."""
    if dtype is np.object_:
        try:
            return [v.encode("utf-8") if isinstance(v, str) else v for v in items]
        except UnicodeEncodeError as e:
            raise ClientError(f"{name} is not valid text: {e.reason} (character {e.start})",
                              code="INVALID_ARG") from None
    if np.issubdtype(dtype, np.integer):
        limits = np.iinfo(dtype)
        bad = next((v for v in items if not limits.min <= int(v) <= limits.max), None)
        if bad is not None:
            raise ClientError(f"{name} {bad} is out of range ({np.dtype(dtype).name}: {limits.min}..{limits.max})",
                              code="INVALID_ARG")
    return items


@dataclass
class StreamedResponse:
    """One response of a gRPC stream: its outputs as numpy arrays, whether it was the final one."""

    outputs: dict[str, np.ndarray]
    final: bool
    at_s: float  # seconds after the request was sent


def stream_infer(
    url: str,
    model: str,
    inputs: list,
    *,
    on_response: Callable[[StreamedResponse], None] | None = None,
    cancel: threading.Event | None = None,
    timeout_s: float = 600.0,
    request_id: str = "",
) -> tuple[list[StreamedResponse], bool]:
    """Send one request on a fresh gRPC stream; collect responses until the final one.

    Returns (responses, cancelled). Raises :class:`ClientError` on an error response.
    """
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    events: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(url)
    responses: list[StreamedResponse] = []
    done = False
    try:
        client.start_stream(callback=lambda result, error: events.put((result, error)))
        t0 = time.perf_counter()
        client.async_stream_infer(model, inputs, request_id=request_id, enable_empty_final_response=True)
        deadline = t0 + timeout_s
        while True:
            if cancel is not None and cancel.is_set():
                return responses, True
            try:
                result, error = events.get(timeout=0.05)  # short waits so a cancel is noticed
            except queue.Empty:
                if time.perf_counter() > deadline:
                    raise ClientError(f"no final response within {timeout_s:.0f}s") from None
                continue
            if error is not None:
                done = True
                raise _stream_error(error)
            item = _streamed(result, t0)
            if item.outputs:  # the empty final response carries nothing
                responses.append(item)
            if on_response is not None:
                on_response(item)
            if item.final:
                done = True
                return responses, False
    except InferenceServerException as e:
        raise _stream_cause(events, e) or ClientError(one_line(e.message()), code=e.status()) from None
    finally:
        try:
            client.stop_stream(cancel_requests=not done)
        finally:
            client.close()


def _streamed(result: Any, t0: float) -> StreamedResponse:
    """A gRPC stream's ``InferResult`` as a :class:`StreamedResponse` (``t0``: when the request was sent)."""
    resp = result.get_response()
    final = "triton_final_response" in resp.parameters and resp.parameters["triton_final_response"].bool_param
    outputs = {o.name: result.as_numpy(o.name) for o in resp.outputs}
    return StreamedResponse(outputs, bool(final), time.perf_counter() - t0)


def _stream_cause(events: queue.Queue, error: Any, wait_s: float = 1.0) -> ClientError | None:
    """Why the stream ended, when a call on it said only that it had ("The stream is no longer in valid
    state, the error detail is reported through provided callback": a port that does not speak gRPC,
    a server gone): the error its callback queued in ``events``, None if there is none."""
    if "no longer in valid state" not in error.message():
        return None
    deadline = time.monotonic() + wait_s
    while (left := deadline - time.monotonic()) > 0:
        try:
            _, queued = events.get(timeout=left)
        except queue.Empty:
            return None
        if queued is not None:
            return _stream_error(queued)
    return None


def _stream_error(error: Exception) -> ClientError:
    """An error response of a gRPC stream as a one-line :class:`ClientError` (with Triton's code, if any)."""
    from tritonclient.utils import InferenceServerException

    if isinstance(error, InferenceServerException):
        return ClientError(one_line(error.message()), code=error.status())
    return ClientError(one_line(str(error)))


def generate_grpc(
    url: str,
    prompt: str,
    params: GenerateParams = GenerateParams(),
    *,
    stream: bool = True,
    on_text: OnText | None = None,
    cancel: threading.Event | None = None,
    timeout_s: float = 600.0,
    model: str = SPEC_DECODE,
    request_id: str = "",
) -> ClientResult:
    """One request over a gRPC stream; ``on_text`` gets each text piece as it arrives."""
    values = {"text_input": prompt, "stream": stream, **params.fields()}
    t0 = time.perf_counter()
    first: list[float] = []

    def on_response(r: StreamedResponse) -> None:
        text = _text(r.outputs)
        if text:
            if not first:
                first.append(r.at_s)
            if on_text is not None:
                on_text(text)

    responses, cancelled = stream_infer(
        url, model, grpc_inputs(values), on_response=on_response, cancel=cancel, timeout_s=timeout_s,
        request_id=request_id,
    )
    chunks = [t for r in responses if (t := _text(r.outputs))]
    final = responses[-1].outputs if responses and not cancelled else {}
    result = _result(chunks, final, protocol="grpc", total_s=time.perf_counter() - t0)
    result.ttft_s = first[0] if first else None
    if cancelled:
        result.finish_reason = "cancelled"
    return result


# -- gRPC, asyncio -----------------------------------------------------------------------


@dataclass
class StreamEvent:
    """One step of an asyncio generation: a piece of text, or (last) the whole result."""

    text: str = ""
    result: ClientResult | None = None  # set on the final event only
    # With logprobs asked: the tokens this piece's iteration emitted and their log-probabilities
    token_ids: tuple[int, ...] = ()
    logprobs: tuple[float, ...] = ()
    top_logprobs: tuple[list[tuple[int, float]], ...] = ()  # with top_logprobs asked


async def stream_infer_aio(client: Any, model: str, inputs: list, *, request_id: str = "") -> AsyncIterator[StreamedResponse]:
    """Send one request on a new stream of ``client`` and yield its responses up to the final one.

    ``client`` is a ``tritonclient.grpc.aio.InferenceServerClient``, shared by
    all requests (its one channel carries every stream). Closing the iterator
    before the final response (the caller went away) cancels the gRPC call,
    which Triton sees as a cancelled request. Raises :class:`ClientError` on
    an error response or a failed call.
    """
    import grpc
    from tritonclient.utils import InferenceServerException

    finished = asyncio.Event()

    async def requests() -> AsyncIterator[dict]:
        yield {"model_name": model, "inputs": inputs, "request_id": request_id}
        await finished.wait()  # the stream stays open until the final response

    t0 = time.perf_counter()
    call = client.stream_infer(requests())
    try:
        async for result, error in call:
            if error is not None:
                finished.set()
                raise _stream_error(error)
            item = _streamed(result, t0)
            if item.final:
                finished.set()
            yield item
            if item.final:
                return
        raise ClientError(f"the stream of model '{model}' closed before its final response", code="UNAVAILABLE")
    except grpc.RpcError as e:
        finished.set()
        raise ClientError(one_line(f"gRPC call failed: {e.details() if hasattr(e, 'details') else e}"),
                          code="UNAVAILABLE") from None
    except InferenceServerException as e:
        finished.set()
        raise ClientError(one_line(e.message()), code=e.status()) from None
    finally:
        if not finished.is_set():
            call.cancel()
            finished.set()


async def generate_aio(
    client: Any, prompt: str, params: GenerateParams = GenerateParams(), *, model: str = SPEC_DECODE,
    request_id: str = "",
) -> AsyncIterator[StreamEvent]:
    """One streamed request through a shared asyncio client: text pieces as they come, then the result."""
    values = {"text_input": prompt, "stream": True, **params.fields()}
    chunks: list[str] = []
    ttft: float | None = None
    async for r in stream_infer_aio(client, model, grpc_inputs(values), request_id=request_id):
        text = _text(r.outputs)
        # with logprobs asked, a streamed piece carries its iteration's tokens (the final one: the whole output's)
        piece = not r.final and "output_log_probs" in r.outputs
        if text:
            ttft = r.at_s if ttft is None else ttft
            chunks.append(text)
        if piece:
            yield StreamEvent(text, None, tuple(_ids(r.outputs)), tuple(_logprobs(r.outputs)), tuple(_top(r.outputs)))
        elif text:
            yield StreamEvent(text)
        if r.final:
            result = _result(chunks, r.outputs, protocol="grpc", total_s=r.at_s)
            result.ttft_s = ttft
            yield StreamEvent(result=result)


# -- HTTP --------------------------------------------------------------------------------


def generate_http(
    url: str,
    prompt: str,
    params: GenerateParams = GenerateParams(),
    *,
    stream: bool = False,
    on_text: OnText | None = None,
    timeout_s: float = 600.0,
    model: str = SPEC_DECODE,
) -> ClientResult:
    """One request to Triton's ``generate`` (``stream=False``) or ``generate_stream`` endpoint."""
    host, port = parse_url(url)
    endpoint = "generate_stream" if stream else "generate"
    body = {"text_input": prompt, "stream": stream, **params.fields()}
    _check_http_values(body)
    req = urllib.request.Request(
        f"http://{host}:{port}/v2/models/{model}/{endpoint}",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    t0 = time.perf_counter()
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            if stream:
                events, ttft = _read_sse(resp, on_text, t0)
            else:
                events, ttft = [json.loads(resp.read())], time.perf_counter() - t0
    except urllib.error.HTTPError as e:
        raise _http_error(e) from None
    except urllib.error.URLError as e:
        raise ClientError(f"cannot reach {host}:{port}: {e.reason}", code="UNAVAILABLE") from None
    except http.client.HTTPException as e:  # something answered, not in HTTP/1.1: a gRPC port?
        raise ClientError(f"{host}:{port} did not answer in HTTP ({type(e).__name__}); is it Triton's HTTP port?",
                          code="UNAVAILABLE") from None
    if not stream:
        if events and "error" in events[0]:
            raise ClientError(one_line(str(events[0]["error"])))
        if on_text is not None and events and events[0].get("text_output"):
            on_text(events[0]["text_output"])
    chunks = [t for e in events if (t := e.get("text_output") or "")]
    final = {k: np.array([v]) for k, v in (events[-1] if events else {}).items()}
    result = _result(chunks, final, protocol="http", total_s=time.perf_counter() - t0)
    result.ttft_s = ttft
    return result


def _read_sse(resp: Any, on_text: OnText | None, t0: float) -> tuple[list[dict], float | None]:
    """The events of a ``generate_stream`` answer (server-sent ``data: {...}`` lines), each text passed to
    ``on_text`` as it comes; and when the first text came (seconds after ``t0``, None if none did)."""
    events: list[dict] = []
    ttft: float | None = None
    for raw in resp:
        line = raw.decode("utf-8").strip()
        if not line.startswith("data:"):
            continue
        event = json.loads(line[len("data:"):])
        if "error" in event:
            raise ClientError(one_line(str(event["error"])))
        text = event.get("text_output") or ""
        if text:
            ttft = time.perf_counter() - t0 if ttft is None else ttft
            if on_text is not None:
                on_text(text)
        events.append(event)
    return events, ttft


_HTTP_CODES = {400: "INVALID_ARG", 404: "NOT_FOUND", 499: "CANCELLED", 500: "INTERNAL", 503: "UNAVAILABLE"}


def _http_error(e: urllib.error.HTTPError) -> ClientError:
    body = e.read().decode("utf-8", errors="replace").strip()
    if body.startswith("data:"):  # generate_stream answers an early error as an event
        body = body[len("data:") :].strip()
    try:
        message = json.loads(body).get("error", body)
    except (json.JSONDecodeError, AttributeError):
        message = body or e.reason
    return ClientError(one_line(str(message)), code=_HTTP_CODES.get(e.code), http_status=e.code)


# What spec_decode's error messages mean (docs/serving.md, "Errors"), for gRPC
# streaming, which delivers an error's message without its code. A message that
# none of these prefixes starts is the request's fault (INVALID_ARG).
_CODE_BY_PREFIX = (
    ("request cancelled", "CANCELLED"),
    ("internal error", "INTERNAL"),
    ("server busy", "UNAVAILABLE"),
    ("the server is shutting down", "UNAVAILABLE"),
    ("model '", "UNAVAILABLE"),  # a draft/target call failed, was late, or the model is down
    ("Request for unknown model", "NOT_FOUND"),  # Triton itself
)


def error_code(error: ClientError) -> str:
    """The Triton error code of ``error``: its own when the transport said, else read from its message."""
    if error.code:
        return str(error.code).removeprefix("StatusCode.")
    message = re.sub(r"^\[request id: [^\]]*\] ", "", error.message)  # Triton's own errors carry one
    return next((code for prefix, code in _CODE_BY_PREFIX if message.startswith(prefix)), "INVALID_ARG")


# -- shared -----------------------------------------------------------------------------


def output_value(outputs: Mapping[str, np.ndarray], name: str, cast: Callable[[Any], Any], default: Any) -> Any:
    """The first element of output ``name`` (BYTES decoded as UTF-8) through ``cast``; ``default``
    when the response lacks it or it is empty."""
    arr = outputs.get(name)
    if arr is None:
        return default
    flat = np.asarray(arr).reshape(-1)
    if flat.size == 0:
        return default
    v = flat[0]
    return cast(v.decode("utf-8", errors="replace") if isinstance(v, bytes) else v)


def _text(outputs: Mapping[str, np.ndarray]) -> str:
    return output_value(outputs, "text_output", str, "")


def _result(chunks: list[str], final: Mapping[str, np.ndarray], *, protocol: str, total_s: float) -> ClientResult:
    drafted = output_value(final, "num_draft_tokens", int, 0)
    return ClientResult(
        text="".join(chunks),
        finish_reason=output_value(final, "finish_reason", str, None),
        num_input_tokens=output_value(final, "num_input_tokens", int, 0),
        num_output_tokens=output_value(final, "num_output_tokens", int, 0),
        num_draft_tokens=drafted,
        num_accepted_tokens=output_value(final, "num_accepted_tokens", int, 0),
        acceptance_rate=output_value(final, "acceptance_rate", float, None) if drafted else None,
        total_s=total_s,
        protocol=protocol,
        chunks=chunks,
        output_ids=_ids(final),
        logprobs=_logprobs(final) if "output_log_probs" in final else None,
        top_logprobs=_top(final) if "top_output_ids" in final else None,
    )


def _ids(outputs: Mapping[str, np.ndarray]) -> list[int]:
    return [int(t) for t in np.asarray(outputs.get("output_ids", [])).reshape(-1)]


def _logprobs(outputs: Mapping[str, np.ndarray]) -> list[float]:
    return [float(x) for x in np.asarray(outputs.get("output_log_probs", [])).reshape(-1)]


def _top(outputs: Mapping[str, np.ndarray]) -> list[list[tuple[int, float]]]:
    """``top_output_ids`` / ``top_log_probs`` as each position's ``(id, logprob)`` pairs (none: [])."""
    if "top_output_ids" not in outputs:
        return []
    positions = len(_ids(outputs))  # one row each ([1, n, N] over gRPC; Triton's generate endpoint sends it flat)
    if not positions:
        return []
    ids, values = np.asarray(outputs["top_output_ids"]), np.asarray(outputs["top_log_probs"])
    return top_pairs(ids.reshape(positions, -1), values.reshape(positions, -1))
