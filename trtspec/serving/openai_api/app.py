"""The FastAPI application of the OpenAI-compatible endpoint.

Each request becomes one ``spec_decode`` request over a gRPC stream (one
``tritonclient.grpc.aio`` client per app; its channel carries every stream).
Chat messages go through the pair's chat template here, once, and are sent
with ``apply_chat_template: false``; a completions prompt is sent as is, also
untemplated. A client that hangs up cancels its Triton request (the gRPC call
is cancelled, ``spec_decode`` stops the loop and frees the sessions).

Errors are OpenAI's error JSON: 400 for a bad request (ours or
``spec_decode``'s INVALID_ARG), 401 without the API key when one is set, 404
for an unknown model or route, 503 when Triton or a model is unavailable, 500
otherwise. A stream whose first response is an
error answers with that status; an error after text was streamed arrives as a
last ``data: {"error": ...}`` event before ``data: [DONE]``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hmac
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.exceptions import HTTPException

from trtspec.errors import InvalidRequestError
from trtspec.runtime.tokenizer import Tokenizer
from trtspec.serving.drain import read_drain
from trtspec.serving.client import ClientError, ClientResult, StreamEvent, error_code, generate_aio
from trtspec.serving.openai_api.metrics import ProxyMetrics
from trtspec.serving.openai_api.render import Renderer, sse
from trtspec.serving.openai_api.schema import ChatCompletionRequest, CompletionRequest, OpenAIError

T = TypeVar("T")
_STATUS_BY_CODE = {"INVALID_ARG": 400, "NOT_FOUND": 404, "CANCELLED": 499, "UNAVAILABLE": 503}


@dataclass(frozen=True)
class ProxySettings:
    """What the app forwards to and what it knows of the model."""

    triton_grpc: str  # HOST:PORT of Triton's gRPC endpoint
    model: str  # the Triton model (spec_decode)
    served_name: str  # the model id clients name (GET /v1/models)
    max_tokens_limit: int  # spec_decode's; a chat request without max_tokens gets this many
    tokenizer: Tokenizer | None  # the pair's, for the chat template (None: chat refused)
    status_dir: Path | None = None  # trtspec serve's status directory: /health is 503 while the server drains
    api_key: str | None = None  # when set, /v1/* asks for "Authorization: Bearer <api_key>" (401 without)


class _ClientGone(Exception):
    """The HTTP client hung up before its answer was ready."""


def create_app(settings: ProxySettings, metrics: ProxyMetrics | None = None) -> FastAPI:
    """The app; ``metrics`` (a fresh :class:`ProxyMetrics` by default) is served on ``/metrics``."""
    import tritonclient.grpc.aio as grpc_aio

    proxy = _Proxy(settings, metrics or ProxyMetrics())

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        proxy.triton = grpc_aio.InferenceServerClient(settings.triton_grpc)  # bound to this event loop
        try:
            yield
        finally:
            await proxy.triton.close()

    app = FastAPI(title="trtspec OpenAI-compatible endpoint", lifespan=lifespan)
    for refused in (OpenAIError, RequestValidationError, HTTPException):  # HTTPException: FastAPI's own
        app.add_exception_handler(refused, proxy.refuse)
    app.add_api_route("/health", proxy.health, methods=["GET"])
    app.add_api_route("/metrics", proxy.prometheus, methods=["GET"])
    app.add_api_route("/v1/models", proxy.models, methods=["GET"])
    app.add_api_route("/v1/models/{model:path}", proxy.model, methods=["GET"])
    if settings.api_key is not None:
        app.add_middleware(_RequireKey, key=settings.api_key, metrics=proxy.metrics)

    @app.post("/v1/chat/completions")
    async def chat(body: ChatCompletionRequest, request: Request) -> Response:
        return await proxy.answer(request, body, "chat")

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request) -> Response:
        return await proxy.answer(request, body, "completions")

    return app


class _RequireKey:
    """ASGI middleware: with an API key set, a /v1 request must carry it as ``Authorization: Bearer <key>``
    (OpenAI's 401 ``invalid_api_key`` otherwise), asked before anything else, the body included;
    /health and /metrics stay open to probes and scrapers. Plain ASGI: responses stream through untouched."""

    def __init__(self, app: Any, key: str, metrics: ProxyMetrics) -> None:
        self.app = app
        self.key = key.encode()
        self.metrics = metrics

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] == "http" and scope["path"].startswith("/v1"):
            error = self._refusal(dict(scope["headers"]).get(b"authorization", b""))
            if error is not None:
                self.metrics.refused(scope["path"], error.status)
                await JSONResponse(error.body(), status_code=error.status)(scope, receive, send)
                return
        await self.app(scope, receive, send)

    def _refusal(self, header: bytes) -> OpenAIError | None:
        scheme, _, given = header.partition(b" ")
        if scheme.lower() != b"bearer" or not given.strip():
            return OpenAIError(401, "no API key: send the header Authorization: Bearer <key>", code="invalid_api_key")
        if not hmac.compare_digest(given.strip(), self.key):
            return OpenAIError(401, "incorrect API key", code="invalid_api_key")
        return None


class _Proxy:
    """What the routes do, over what they share: the settings, the metrics and the Triton client
    (opened by the app's lifespan, on its event loop)."""

    def __init__(self, settings: ProxySettings, metrics: ProxyMetrics) -> None:
        self.settings = settings
        self.metrics = metrics
        self.triton: Any = None

    async def health(self) -> Response:
        if read_drain(self.settings.status_dir) is not None:  # shutting down: route nothing new here
            return JSONResponse({"status": "draining", "model": self.settings.model}, status_code=503)
        try:
            ready = await self.triton.is_model_ready(self.settings.model)
        except Exception:  # Triton unreachable is "not healthy", whatever the exception
            ready = False
        return JSONResponse({"status": "ok" if ready else "unavailable", "model": self.settings.model},
                            status_code=200 if ready else 503)

    async def refuse(self, request: Request, e: Exception) -> JSONResponse:
        """The exception handler of what is refused outside :meth:`answer`: counted, in OpenAI's JSON."""
        error = _refusal(request, e)
        self.metrics.refused(request.url.path, error.status)
        return JSONResponse(error.body(), status_code=error.status, headers=getattr(e, "headers", None))

    async def prometheus(self) -> Response:
        return Response(self.metrics.exposition(), media_type=CONTENT_TYPE_LATEST)

    async def models(self) -> dict:
        return {"object": "list", "data": [self._model_object()]}

    async def model(self, model: str) -> dict:
        """OpenAI's "retrieve model" (the SDK's ``models.retrieve``)."""
        self._refuse_other_model(model)
        return self._model_object()

    def _model_object(self) -> dict:
        return {"id": self.settings.served_name, "object": "model", "created": 0, "owned_by": "trtspec"}

    def _refuse_other_model(self, model: str) -> None:
        if model != self.settings.served_name:
            raise OpenAIError(404, f"model {model!r} does not exist; this server serves {self.settings.served_name!r}",
                              "model", "model_not_found")

    async def answer(self, request: Request, body: ChatCompletionRequest | CompletionRequest, kind: str) -> Response:
        t0 = time.perf_counter()
        endpoint = "/v1/chat/completions" if kind == "chat" else "/v1/completions"
        renderer = Renderer(kind, self.settings.served_name)
        metrics = self.metrics
        metrics.in_flight.inc()
        try:
            events = self._start(body, renderer.id)  # not started yet: nothing is sent before it is iterated
            renderer = dataclasses.replace(renderer, token_texts=self._token_texts(body), echoed=body.echoed)
            if body.stream:  # the first response first: an error before any text gets its own status
                first = await _unless_disconnected(request, anext(events))
                stream = self._stream(renderer, first, events, body.include_usage, endpoint, t0)
                return StreamingResponse(stream, media_type="text/event-stream")  # the stream counts from here
            result = await _unless_disconnected(request, _collect(events))
            status, ttft, response = 200, result.ttft_s, JSONResponse(renderer.body(result))
        except (OpenAIError, ClientError, _ClientGone) as e:
            error = _as_openai_error(e)
            status, ttft, response = error.status, None, JSONResponse(error.body(), status_code=error.status)
        except BaseException:
            metrics.in_flight.dec()
            raise
        metrics.finished(endpoint, status, time.perf_counter() - t0, ttft)
        metrics.in_flight.dec()
        return response

    def _token_texts(self, body: ChatCompletionRequest | CompletionRequest) -> Callable[[Sequence[int]], list[str]] | None:
        """Each token's text, for the log-probabilities a request asks (None: none asked)."""
        if not body.wants_logprobs:
            return None
        if self.settings.tokenizer is None:
            raise OpenAIError(400, "this server has no tokenizer to name the tokens of logprobs", "logprobs")
        return self.settings.tokenizer.token_texts

    def _start(self, body: ChatCompletionRequest | CompletionRequest, request_id: str) -> AsyncIterator[StreamEvent]:
        settings = self.settings
        self._refuse_other_model(body.model)
        body.refuse_unsupported()
        if isinstance(body, ChatCompletionRequest):
            if settings.tokenizer is None:
                raise OpenAIError(400, "this server has no tokenizer to apply a chat template; use /v1/completions")
            try:
                prompt = settings.tokenizer.render_chat(body.chat())
            except InvalidRequestError as e:
                raise OpenAIError(400, f"{e}; use /v1/completions", "messages") from None
        else:
            prompt = body.text()
        params = body.params(body.requested_max_tokens, settings.max_tokens_limit, apply_chat_template=False)
        return generate_aio(self.triton, prompt, params, model=settings.model, request_id=request_id)

    async def _stream(self, renderer: Renderer, first: StreamEvent, events: AsyncIterator[StreamEvent],
                      include_usage: bool, endpoint: str, t0: float) -> AsyncIterator[str]:
        status, ttft = 499, None  # a stream cut short is the client's doing (Starlette cancels us)
        try:
            # chat opens with the role, completions with the echoed prompt: sent with the first text, one write
            opening = renderer.opening(include_usage)
            head = sse(opening) if opening is not None else ""
            event = first
            while event.result is None:
                ttft = time.perf_counter() - t0 if ttft is None and event.text else ttft
                yield head + sse(renderer.chunk(event.text, with_usage_field=include_usage,
                                                token_ids=event.token_ids, logprobs=event.logprobs,
                                                top=event.top_logprobs))
                head = ""
                event = await anext(events)
            yield head + sse(renderer.chunk(result=event.result, with_usage_field=include_usage))
            if include_usage:
                yield sse(renderer.usage_chunk(event.result))
            status = 200
        except ClientError as e:
            error = _as_openai_error(e)
            status = error.status
            yield sse(error.body())
        finally:
            await events.aclose()  # cancels the Triton request if it is still running
            self.metrics.finished(endpoint, status, time.perf_counter() - t0, ttft)
            self.metrics.in_flight.dec()
        yield sse("[DONE]")


def _refusal(request: Request, e: Exception) -> OpenAIError:
    """An error raised before or outside :meth:`_Proxy.answer` as OpenAI's: ours, a body FastAPI could not
    read or validate, or one FastAPI raised itself ({"detail": ...} by default: no route, a wrong method)."""
    if isinstance(e, OpenAIError):
        return e
    if isinstance(e, RequestValidationError):
        return _validation_error(e)
    assert isinstance(e, HTTPException)
    message = {404: f"no such endpoint: {request.method} {request.url.path}",
               405: f"{request.method} is not allowed on {request.url.path}"}.get(e.status_code, str(e.detail))
    return OpenAIError(e.status_code, message)


async def _collect(events: AsyncIterator[StreamEvent]) -> ClientResult:
    async for event in events:
        if event.result is not None:
            return event.result
    raise ClientError("the stream ended without a result", code="UNAVAILABLE")


async def _unless_disconnected(request: Request, work: Awaitable[T]) -> T:
    """Await ``work`` unless the HTTP client hangs up first: then cancel it and raise :class:`_ClientGone`."""
    task = asyncio.ensure_future(work)
    gone = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
    if not task.done():
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        raise _ClientGone("the client disconnected")
    return task.result()


async def _disconnected(request: Request) -> None:
    """Returns when the client hangs up (the body is read: the next message is the disconnect)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


def _as_openai_error(e: Exception) -> OpenAIError:
    if isinstance(e, OpenAIError):
        return e
    if isinstance(e, _ClientGone):
        return OpenAIError(499, "the client disconnected")
    assert isinstance(e, ClientError)
    code = error_code(e)
    return OpenAIError(_STATUS_BY_CODE.get(code, 500), e.message, code=code.lower())


def _validation_error(e: RequestValidationError) -> OpenAIError:
    """Pydantic's first complaint as one line, naming the field; a body that is no JSON object says so."""
    first = e.errors()[0] if e.errors() else {}
    if first.get("type") == "json_invalid":
        return OpenAIError(400, f"the body is not valid JSON: {first.get('ctx', {}).get('error', 'cannot parse it')} "
                                f"(at character {first['loc'][-1]})")
    if tuple(first.get("loc", ())) == ("body",):  # no body, or one FastAPI did not read as JSON
        return OpenAIError(400, "the body must be a JSON object, sent with Content-Type: application/json")
    loc = [str(p) for p in first.get("loc", ()) if p != "body"]
    param = ".".join(loc) or None
    message = first.get("msg", "invalid request body")
    return OpenAIError(400, f"{param}: {message}" if param else message, param)
