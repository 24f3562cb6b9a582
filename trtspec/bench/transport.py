"""How ``trtspec bench`` talks to the server: gRPC streaming (asyncio), HTTP ``generate_stream`` (threads)
or the OpenAI-compatible endpoint (asyncio, the official ``openai`` SDK).

Both fill a :class:`~trtspec.bench.records.RequestRecord` in place and never
raise for a request that fails: the failure becomes the record's ``error``
(one line) and ``error_category``.

- gRPC (default): ``tritonclient.grpc.aio``, one bidirectional stream per
  request (so each request can be cancelled alone) over a few shared channels.
  The request stream stays open until the final response, which is the one
  carrying ``finish_reason``; on a timeout the stream is cancelled, which the
  server sees as a cancelled request.
- HTTP: :func:`trtspec.serving.client.generate_http` (``generate_stream``,
  server-sent events) on a thread pool. A request that times out is recorded
  as such at once; its thread finishes when the server answers or the socket
  times out. Threads make HTTP the weaker load generator: prefer gRPC for high
  rates.
- OpenAI: ``openai.AsyncOpenAI`` against ``trtspec serve --openai-port``:
  streamed chat completions with usage, the prompt as one user message (the
  proxy applies the chat template as ``spec_decode`` does for Triton clients,
  so both paths decode the same tokens), greedy (``temperature`` 0, Triton's
  default), the arm as the ``speculation`` extension (``priority`` and ``drafter`` too). A timeout closes the
  stream, which cancels the request on the server.

:meth:`Transport.probe` measures the client's own maximum send rate: requests
to a model that does not exist, which Triton refuses at once without touching
a model, sent as fast as the client can for a second or so.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Protocol

from trtspec.bench.records import OTHER, REFUSED, TIMEOUT, RequestRecord, categorize
from trtspec.bench.workload import RequestSpec
from trtspec.errors import one_line
from trtspec.serving.client import ClientError, GenerateParams, generate_http, grpc_inputs, output_value
from trtspec.wire import SPEC_DECODE

Clock = Callable[[], float]

PROBE_MODEL = "trtspec_bench_probe_no_such_model"


class Transport(Protocol):
    name: str

    async def send(self, spec: RequestSpec, rec: RequestRecord, clock: Clock, timeout_s: float) -> None:
        """Send ``spec``, fill ``rec`` (``sent_s`` when it leaves, chunks, counts or error)."""

    async def probe(self, duration_s: float = 1.0, concurrency: int = 64) -> float:
        """The client's maximum send rate (requests/s) against refused requests."""

    async def close(self) -> None: ...


def _params(spec: RequestSpec) -> GenerateParams:
    return GenerateParams(max_tokens=spec.max_tokens, speculation=spec.arm, priority=spec.priority,
                          drafter=spec.drafter)


def _grpc_inputs(spec: RequestSpec) -> list:
    """The streamed gRPC request's inputs."""
    return grpc_inputs({"text_input": spec.prompt, "stream": True, **_params(spec).fields()})


def _openai_extra_body(spec: RequestSpec) -> dict:
    """The trtspec extensions (``speculation``, ``priority``, ``drafter``) of the OpenAI request."""
    return {k: v for k, v in _params(spec).fields().items() if k != "max_tokens"}


class GrpcTransport:
    """gRPC streaming over ``channels`` shared aio channels, one stream per request."""

    name = "grpc"

    def __init__(self, url: str, *, channels: int = 4, model: str = SPEC_DECODE) -> None:
        import tritonclient.grpc.aio as aio

        self.url = url
        self.model = model
        # Unlimited message sizes; keepalive defaults are fine on loopback and LAN.
        self._clients = [aio.InferenceServerClient(url) for _ in range(max(1, channels))]
        self._turn = 0

    def _client(self):
        self._turn = (self._turn + 1) % len(self._clients)
        return self._clients[self._turn]

    async def send(self, spec: RequestSpec, rec: RequestRecord, clock: Clock, timeout_s: float) -> None:
        await self._stream(self.model, _grpc_inputs(spec), spec.request_id, rec, clock, timeout_s)

    async def _stream(self, model: str, inputs: list, request_id: str, rec: RequestRecord, clock: Clock,
                      timeout_s: float) -> None:
        import grpc
        from tritonclient.utils import InferenceServerException

        done = asyncio.Event()

        async def requests():
            rec.sent_s = clock()
            yield {"model_name": model, "inputs": inputs, "request_id": request_id}
            await done.wait()  # keep our side open until the final response

        call = self._client().stream_infer(requests())
        try:
            await asyncio.wait_for(self._consume(call, rec, clock), timeout_s)
        except asyncio.TimeoutError:
            rec.error, rec.error_category = f"no final response within {timeout_s:g}s", TIMEOUT
        except InferenceServerException as e:
            rec.error = one_line(e.message())
            rec.error_category = categorize(rec.error, e.status())
        except grpc.aio.AioRpcError as e:
            rec.error = one_line(e.details() or str(e.code()))
            rec.error_category = categorize(rec.error, str(e.code()))
        finally:
            if rec.done_s is None:
                rec.done_s = clock()
            if rec.sent_s is None:  # the stream never took the request (cannot connect, ...)
                rec.sent_s = rec.done_s
            done.set()
            call.cancel()  # after the final response this only frees the stream

    @staticmethod
    async def _consume(call, rec: RequestRecord, clock: Clock) -> None:
        async for result, error in call:
            now = clock()
            if error is not None:
                rec.done_s = now
                rec.error = one_line(error.message())
                rec.error_category = categorize(rec.error, error.status())
                return
            outputs = {o.name: result.as_numpy(o.name) for o in result.get_response().outputs}
            text = output_value(outputs, "text_output", str, "")
            if text:
                assert rec.sent_s is not None
                rec.chunks.append((now - rec.sent_s, len(text)))
            if "finish_reason" in outputs:  # the final response: spec_decode's counts ride on it
                rec.done_s = now
                rec.finish_reason = output_value(outputs, "finish_reason", str, None)
                rec.input_tokens = output_value(outputs, "num_input_tokens", int, 0)
                rec.output_tokens = output_value(outputs, "num_output_tokens", int, 0)
                rec.drafted = output_value(outputs, "num_draft_tokens", int, 0)
                rec.accepted = output_value(outputs, "num_accepted_tokens", int, 0)
                return
        rec.done_s = clock()
        rec.error, rec.error_category = "the stream closed without a final response", OTHER

    async def probe(self, duration_s: float = 1.0, concurrency: int = 64) -> float:
        from trtspec.bench.workload import RequestSpec

        clock = time.perf_counter
        spec = RequestSpec(0, "probe", 1, "off")
        inputs = _grpc_inputs(spec)
        return await _probe(lambda rec: self._stream(PROBE_MODEL, inputs, "probe", rec, clock, 10.0),
                            duration_s, concurrency)

    async def close(self) -> None:
        for c in self._clients:
            await c.close()


class HttpTransport:
    """Triton's ``generate_stream`` endpoint through :func:`trtspec.serving.client.generate_http`, on threads."""

    name = "http"

    def __init__(self, url: str, *, threads: int = 128, model: str = SPEC_DECODE) -> None:
        self.url = url
        self.model = model
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="bench-http")

    async def send(self, spec: RequestSpec, rec: RequestRecord, clock: Clock, timeout_s: float) -> None:
        await self._send(self.model, spec, rec, clock, timeout_s)

    async def _send(self, model: str, spec: RequestSpec, rec: RequestRecord, clock: Clock, timeout_s: float) -> None:
        def run() -> tuple[float, list[tuple[float, int]], object]:
            chunks: list[tuple[float, int]] = []
            sent = clock()

            def on_text(text: str) -> None:
                chunks.append((clock() - sent, len(text)))

            try:
                out: object = generate_http(self.url, spec.prompt, _params(spec), stream=True, on_text=on_text,
                                            timeout_s=timeout_s, model=model)
            except ClientError as e:
                out = e
            except OSError as e:  # a socket timeout or reset mid-stream
                out = ClientError(one_line(str(e)))
            return sent, chunks, out

        loop = asyncio.get_running_loop()
        fut = loop.run_in_executor(self._pool, run)
        try:
            sent, chunks, out = await asyncio.wait_for(asyncio.shield(fut), timeout_s)
        except asyncio.TimeoutError:
            # The thread goes on until the server answers or its socket times out; the record is closed now.
            rec.done_s = clock()
            rec.sent_s = rec.sent_s if rec.sent_s is not None else rec.arrival_s
            rec.error, rec.error_category = f"no final response within {timeout_s:g}s", TIMEOUT
            return
        rec.sent_s = sent
        rec.done_s = clock()
        rec.chunks = chunks
        if isinstance(out, ClientError):
            rec.error = one_line(out.message)
            rec.error_category = categorize(rec.error, out.code)
            return
        rec.finish_reason = out.finish_reason  # type: ignore[attr-defined]
        rec.input_tokens = out.num_input_tokens  # type: ignore[attr-defined]
        rec.output_tokens = out.num_output_tokens  # type: ignore[attr-defined]
        rec.drafted = out.num_draft_tokens  # type: ignore[attr-defined]
        rec.accepted = out.num_accepted_tokens  # type: ignore[attr-defined]

    async def probe(self, duration_s: float = 1.0, concurrency: int = 64) -> float:
        from trtspec.bench.workload import RequestSpec

        clock = time.perf_counter
        spec = RequestSpec(0, "probe", 1, "off")
        return await _probe(lambda rec: self._send(PROBE_MODEL, spec, rec, clock, 10.0), duration_s, concurrency)

    async def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


# OpenAI error statuses as Triton's codes, for :func:`categorize`
_CODE_BY_STATUS = {400: "INVALID_ARG", 404: "INVALID_ARG", 499: "CANCELLED", 500: "INTERNAL", 503: "UNAVAILABLE"}


class OpenAITransport:
    """The OpenAI-compatible endpoint through the official SDK (``url``: ``HOST:PORT`` or ``http://HOST:PORT/v1``)."""

    name = "openai"

    def __init__(self, url: str, *, model: str | None = None) -> None:
        from openai import AsyncOpenAI

        base = (url if "://" in url else f"http://{url}").rstrip("/")
        self.url = base if base.endswith("/v1") else f"{base}/v1"
        self.model = model  # None: the one the endpoint lists (trtspec serve --openai-model-name may rename it)
        # the SDK's own convention: the key in $OPENAI_API_KEY (a server without --openai-api-key ignores it)
        self._client = AsyncOpenAI(base_url=self.url, api_key=os.environ.get("OPENAI_API_KEY") or "unused",
                                   max_retries=0)

    async def send(self, spec: RequestSpec, rec: RequestRecord, clock: Clock, timeout_s: float) -> None:
        await self._send(self.model, spec, rec, clock, timeout_s)

    async def _send(self, model: str | None, spec: RequestSpec, rec: RequestRecord, clock: Clock,
                    timeout_s: float) -> None:
        import openai

        rec.sent_s = clock()
        try:
            await asyncio.wait_for(self._consume(model, spec, rec, clock), timeout_s)
        except asyncio.TimeoutError:
            rec.error, rec.error_category = f"no final response within {timeout_s:g}s", TIMEOUT
        except openai.APIStatusError as e:
            rec.error = one_line(e.message)
            rec.error_category = categorize(rec.error, _CODE_BY_STATUS.get(e.status_code))
        except openai.APIConnectionError as e:
            rec.error = one_line(f"cannot reach {self.url}: {e.__cause__ or e}")
            rec.error_category = REFUSED
        finally:
            if rec.done_s is None:
                rec.done_s = clock()

    async def _served_model(self) -> str:
        if self.model is None:
            self.model = (await self._client.models.list()).data[0].id
        return self.model

    async def _consume(self, model: str | None, spec: RequestSpec, rec: RequestRecord, clock: Clock) -> None:
        model = model or await self._served_model()
        stream = await self._client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": spec.prompt}], max_tokens=spec.max_tokens,
            temperature=0, stream=True, stream_options={"include_usage": True},
            extra_body=_openai_extra_body(spec))
        async with stream:  # leaving early (a timeout) closes the connection: the server cancels the request
            async for chunk in stream:
                now = clock()
                choice = chunk.choices[0] if chunk.choices else None
                if choice is not None and choice.delta.content:
                    assert rec.sent_s is not None
                    rec.chunks.append((now - rec.sent_s, len(choice.delta.content)))
                if choice is not None and choice.finish_reason:
                    figures = (chunk.model_extra or {}).get("trtspec") or {}
                    rec.finish_reason = choice.finish_reason
                    rec.drafted = int(figures.get("num_draft_tokens") or 0)
                    rec.accepted = int(figures.get("num_accepted_tokens") or 0)
                if chunk.usage is not None:  # the last chunk
                    rec.done_s = now
                    rec.input_tokens = chunk.usage.prompt_tokens
                    rec.output_tokens = chunk.usage.completion_tokens
        if rec.finish_reason is None:
            rec.error, rec.error_category = "the stream closed without a final chunk", OTHER

    async def probe(self, duration_s: float = 1.0, concurrency: int = 64) -> float:
        from trtspec.bench.workload import RequestSpec

        clock = time.perf_counter
        spec = RequestSpec(0, "probe", 1, "off")
        return await _probe(lambda rec: self._send(PROBE_MODEL, spec, rec, clock, 10.0), duration_s, concurrency)

    async def close(self) -> None:
        await self._client.close()


async def _probe(one, duration_s: float, concurrency: int) -> float:
    """Requests completed per second by ``concurrency`` loops calling ``one(record)`` for ``duration_s``."""
    t0 = time.perf_counter()
    end = t0 + duration_s
    done = 0

    async def loop() -> None:
        nonlocal done
        while time.perf_counter() < end:
            await one(RequestRecord(0, "off", 1, 0.0))
            done += 1

    await asyncio.gather(*(loop() for _ in range(concurrency)))
    elapsed = time.perf_counter() - t0
    return done / elapsed if elapsed > 0 else 0.0
