"""Run the OpenAI-compatible endpoint: uvicorn on a thread of its own, started and stopped in one place.

``OpenAIServer(triton_grpc).start()`` reads what it needs of the model from
Triton (``max_tokens_limit`` and ``tokenizer_dir`` of ``spec_decode``'s config;
the tokenizer is loaded for the chat template), binds its port and returns
once it accepts connections. ``stop(grace_s)`` is the drain: it stops
accepting, gives the requests in flight up to ``grace_s`` to finish, then
cancels the rest (their Triton requests are cancelled with them).
"""

from __future__ import annotations

import dataclasses

import socket
import threading
import time
from pathlib import Path

from trtspec.errors import CheckpointError, TrtspecError
from trtspec.serving.openai_api.app import ProxySettings, create_app
from trtspec.serving.openai_api.metrics import ProxyMetrics
from trtspec.wire import SPEC_DECODE, SpecDecodeParams

class ProxyError(TrtspecError):
    """The OpenAI endpoint could not start (port taken, Triton or the model not reachable)."""


def load_settings(triton_grpc: str, model: str = SPEC_DECODE, served_name: str | None = None) -> ProxySettings:
    """What the proxy needs to know of ``model``, read from Triton's model configuration."""
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    from trtspec.runtime.tokenizer import Tokenizer

    client = grpcclient.InferenceServerClient(triton_grpc)
    try:
        config = client.get_model_config(model, as_json=True)["config"]
    except InferenceServerException as e:
        raise ProxyError(f"cannot read model {model!r} from Triton at {triton_grpc}: {e.message()}") from None
    finally:
        client.close()
    params = {k: v.get("string_value", "") for k, v in config.get("parameters", {}).items()}
    tokenizer = None
    if params.get("tokenizer_dir"):
        try:
            tokenizer = Tokenizer.from_dir(Path(params["tokenizer_dir"]))
        except CheckpointError as e:
            raise ProxyError(f"model {model!r}: {e}") from None
    limit = params.get("max_tokens_limit") or str(SpecDecodeParams.max_tokens_limit)  # the default when unset
    return ProxySettings(triton_grpc=triton_grpc, model=model, served_name=served_name or model,
                         max_tokens_limit=int(limit), tokenizer=tokenizer)


class OpenAIServer:
    """The OpenAI-compatible endpoint in front of one Triton model (see the module docstring)."""

    def __init__(self, triton_grpc: str, *, model: str = SPEC_DECODE, served_name: str | None = None,
                 host: str = "127.0.0.1", port: int = 0, settings: ProxySettings | None = None,
                 status_dir: Path | None = None, api_key: str | None = None) -> None:
        self.triton_grpc = triton_grpc
        self.status_dir = status_dir  # trtspec serve's: /health turns 503 when it drains
        self.api_key = api_key  # /v1/* asks for it (ProxySettings.api_key)
        self.model = model
        self.served_name = served_name
        self.host = host
        self.port = port
        self.settings = settings
        self.metrics = ProxyMetrics()
        self._server = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        """``http://HOST:PORT`` to connect to (loopback when listening on every interface)."""
        host = "127.0.0.1" if self.host in ("0.0.0.0", "") else ("[::1]" if self.host == "::" else self.host)
        return f"http://{host}:{self.port}"

    @property
    def in_flight(self) -> int:
        return int(self.metrics.registry.get_sample_value("trtspec_openai_requests_in_flight") or 0)

    def start(self, timeout_s: float = 30.0) -> OpenAIServer:
        import uvicorn

        if self._thread is not None:
            raise ProxyError("the OpenAI endpoint is already started")
        if self.settings is None:
            self.settings = load_settings(self.triton_grpc, self.model, self.served_name)
        if self.status_dir is not None:
            self.settings = dataclasses.replace(self.settings, status_dir=self.status_dir)
        if self.api_key is not None:
            self.settings = dataclasses.replace(self.settings, api_key=self.api_key)
        sock = _bind(self.host, self.port)
        self.port = sock.getsockname()[1]
        config = uvicorn.Config(create_app(self.settings, self.metrics), log_level="warning", access_log=False,
                                lifespan="on")
        self._server = server = uvicorn.Server(config)
        self._thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="openai-endpoint",
                                        daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                sock.close()
                raise ProxyError(f"the OpenAI endpoint on {self.host}:{self.port} did not start")
            time.sleep(0.01)  # polling uvicorn's started flag, set from its own thread
        return self

    def stop(self, grace_s: float = 5.0) -> None:
        """Stop accepting; requests in flight get ``grace_s`` seconds to finish, then are cancelled."""
        if self._server is None or self._thread is None:
            return
        self._server.config.timeout_graceful_shutdown = grace_s
        self._server.should_exit = True
        self._thread.join(grace_s + 10.0)
        self._server = None
        self._thread = None

    def __enter__(self) -> OpenAIServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP, not 0: asyncio turns Nagle off (TCP_NODELAY) only on sockets that say they are TCP, and the
    # accepted ones inherit this. With Nagle on, a response's body waited for the ACK of its headers, which a
    # keep-alive client delays: 40 ms on every request.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise ProxyError(f"cannot serve the OpenAI endpoint on {host}:{port}: {e.strerror or e}") from None
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock
