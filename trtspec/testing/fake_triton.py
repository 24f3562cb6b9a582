"""A small, faithful stand-in for ``triton_python_backend_utils`` (pb_utils), for tests outside Triton.

It mirrors the surface the trtspec models use, with the real call shapes:
``Tensor``, ``InferenceResponse``, ``InferenceRequest`` (incoming requests,
and outgoing BLS requests whose ``exec()`` runs the named model's ``execute``
in this process), ``TritonError`` with its codes, ``get_input_tensor_by_name``,
``get_output_tensor_by_name``, the decoupled ``ResponseSender``,
``TRITONSERVER_RESPONSE_COMPLETE_FINAL``, ``Logger``, ``MetricFamily``,
``is_model_ready`` and ``using_decoupled_model_transaction_policy``.

It also checks what Triton checks, so model bugs fail here first: inputs are
validated against the model config (required inputs present, no unknown
inputs, data types match), a decoupled sender refuses anything after the final
flag, a non-decoupled ``execute`` must return exactly one response per request,
and calls into one model instance are serialised as Triton does.

Usage::

    pb = FakeTriton()
    pb.add_model("target", lm.TritonPythonModel(pb), target_config)   # runs initialize
    pb.add_model("spec_decode", spec_decode.TritonPythonModel(pb), sd_config)
    calls = [pb.client_request("spec_decode", {"text_input": ..., "max_tokens": ...}) for ...]
    pb.execute("spec_decode", calls)       # several requests in one execute
    for c in calls: c.wait(); c.responses / c.error
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1

# Triton config data types -> numpy dtypes (the BYTES type is numpy object).
CONFIG_DTYPES: dict[str, Any] = {
    "TYPE_BOOL": np.bool_,
    "TYPE_INT8": np.int8,
    "TYPE_INT16": np.int16,
    "TYPE_INT32": np.int32,
    "TYPE_INT64": np.int64,
    "TYPE_UINT8": np.uint8,
    "TYPE_UINT16": np.uint16,
    "TYPE_UINT32": np.uint32,
    "TYPE_UINT64": np.uint64,
    "TYPE_FP16": np.float16,
    "TYPE_FP32": np.float32,
    "TYPE_FP64": np.float64,
    "TYPE_STRING": np.object_,
}


class TritonModelException(Exception):
    pass


class TritonError:
    """Like pb_utils.TritonError: a message and a code (not an exception)."""

    UNKNOWN = 0
    INTERNAL = 1
    NOT_FOUND = 2
    INVALID_ARG = 3
    UNAVAILABLE = 4
    UNSUPPORTED = 5
    ALREADY_EXISTS = 6
    CANCELLED = 7

    _NAMES = {0: "UNKNOWN", 1: "INTERNAL", 2: "NOT_FOUND", 3: "INVALID_ARG", 4: "UNAVAILABLE",
              5: "UNSUPPORTED", 6: "ALREADY_EXISTS", 7: "CANCELLED"}

    def __init__(self, message: str, code: int = INTERNAL) -> None:
        self._message = message
        self._code = code

    def message(self) -> str:
        return self._message

    def code(self) -> int:
        return self._code

    @property
    def code_name(self) -> str:
        return self._NAMES[self._code]

    def __repr__(self) -> str:
        return f"TritonError({self._message!r}, {self.code_name})"


class Tensor:
    def __init__(self, name: str, array: np.ndarray) -> None:
        if not isinstance(array, np.ndarray):
            raise TypeError(f"Tensor '{name}': expected a numpy array, got {type(array).__name__}")
        self._name = name
        self._array = array

    def name(self) -> str:
        return self._name

    def as_numpy(self) -> np.ndarray:
        return self._array

    def is_cpu(self) -> bool:
        return True


class InferenceResponse:
    def __init__(self, output_tensors: list[Tensor] | None = None, error: TritonError | None = None) -> None:
        self._outputs = list(output_tensors or [])
        self._error = error

    def output_tensors(self) -> list[Tensor]:
        return self._outputs

    def has_error(self) -> bool:
        return self._error is not None

    def error(self) -> TritonError | None:
        return self._error


class ResponseSender:
    """The decoupled response sender of one request; records what the model sent."""

    def __init__(self, request: InferenceRequest) -> None:
        self._request = request
        self._lock = threading.Lock()
        self.responses: list[InferenceResponse] = []
        self.final_count = 0
        self.done = threading.Event()
        # Test hook, called after each send with (response, flags): e.g. cancel after the first chunk.
        self.on_send: Callable[[InferenceResponse | None, int], None] | None = None

    def send(self, response: InferenceResponse | None = None, flags: int = 0) -> None:
        with self._lock:
            if self.final_count:
                raise TritonModelException("Unable to send response. Response sender has been closed.")
            if response is not None:
                self.responses.append(response)
            if flags & TRITONSERVER_RESPONSE_COMPLETE_FINAL:
                self.final_count += 1
        if self.on_send is not None:
            self.on_send(response, flags)
        if flags & TRITONSERVER_RESPONSE_COMPLETE_FINAL:
            self.done.set()

    def is_cancelled(self) -> bool:
        if self.final_count:
            # Triton 2.51 reads the freed response factory here and the whole server dies (SIGSEGV).
            raise AssertionError("is_cancelled() after the final flag crashes the real server")
        return self._request.is_cancelled()


class InferenceRequest:
    """An incoming request (given to ``execute``) or an outgoing BLS request (``exec()``)."""

    def __init__(
        self,
        model_name: str = "",
        inputs: list[Tensor] | None = None,
        requested_output_names: list[str] | None = None,
        request_id: str = "",
        parameters: Mapping | str | None = None,
        timeout: int = 0,
        _server: FakeTriton | None = None,
    ) -> None:
        self.model_name = model_name
        self._inputs = list(inputs or [])
        self._requested = list(requested_output_names or [])
        self._request_id = request_id
        self._parameters = parameters if isinstance(parameters, str) else json.dumps(dict(parameters or {}))
        self._server = _server
        self._cancelled = threading.Event()
        self._sender: ResponseSender | None = None

    # incoming-request side
    def inputs(self) -> list[Tensor]:
        return self._inputs

    def request_id(self) -> str:
        return self._request_id

    def parameters(self) -> str:
        return self._parameters

    def requested_output_names(self) -> list[str]:
        return self._requested

    def is_cancelled(self) -> bool:
        return self._cancelled.is_set()

    def cancel(self) -> None:
        """What a client cancelling its request does (test helper)."""
        self._cancelled.set()

    def get_response_sender(self) -> ResponseSender:
        if self._sender is None:
            self._sender = ResponseSender(self)
        return self._sender

    # outgoing (BLS) side
    def exec(self, decoupled: bool = False) -> InferenceResponse:
        server = self._server or FakeTriton.current
        if server is None:
            raise TritonModelException("no FakeTriton is active for this BLS request")
        if decoupled:
            raise NotImplementedError("decoupled BLS is not faked")
        return server.bls(self)


def get_input_tensor_by_name(request: InferenceRequest, name: str) -> Tensor | None:
    for t in request.inputs():
        if t.name() == name:
            return t
    return None


def get_output_tensor_by_name(response: InferenceResponse, name: str) -> Tensor | None:
    for t in response.output_tensors():
        if t.name() == name:
            return t
    return None


def using_decoupled_model_transaction_policy(model_config: Mapping) -> bool:
    return bool((model_config.get("model_transaction_policy") or {}).get("decoupled", False))


class Logger:
    lines: list[tuple[str, str]] = []
    _lock = threading.Lock()

    @classmethod
    def _log(cls, level: str, msg: str) -> None:
        with cls._lock:
            cls.lines.append((level, msg))

    @classmethod
    def log_info(cls, msg: str) -> None:
        cls._log("info", msg)

    @classmethod
    def log_warn(cls, msg: str) -> None:
        cls._log("warn", msg)

    @classmethod
    def log_error(cls, msg: str) -> None:
        cls._log("error", msg)

    @classmethod
    def log_verbose(cls, msg: str) -> None:
        cls._log("verbose", msg)


class _Metric:
    def __init__(self, labels: Mapping[str, str]) -> None:
        self.labels = dict(labels)
        self._value = 0.0

    def increment(self, value: float) -> None:
        self._value += value

    def set(self, value: float) -> None:
        self._value = value

    def value(self) -> float:
        return self._value


class MetricFamily:
    COUNTER = 0
    GAUGE = 1
    HISTOGRAM = 2
    registry: dict[str, MetricFamily] = {}

    def __init__(self, name: str, description: str, kind: int = COUNTER) -> None:
        self.name = name
        self.description = description
        self.kind = kind
        self.metrics: list[_Metric] = []
        MetricFamily.registry[name] = self

    def Metric(self, labels: Mapping[str, str] | None = None) -> _Metric:  # noqa: N802 (pb_utils' name)
        m = _Metric(labels or {})
        self.metrics.append(m)
        return m


# -- the fake server ----------------------------------------------------------------


@dataclass
class _Model:
    name: str
    instance: Any
    config: dict
    lock: threading.Lock = field(default_factory=threading.Lock)


@dataclass
class ClientCall:
    """One client request sent to a decoupled model, and what came back."""

    request: InferenceRequest

    @property
    def sender(self) -> ResponseSender:
        return self.request.get_response_sender()

    def wait(self, timeout: float = 60.0) -> ClientCall:
        if not self.sender.done.wait(timeout):
            raise TimeoutError(f"no final response within {timeout}s")
        return self

    @property
    def responses(self) -> list[InferenceResponse]:
        return self.sender.responses

    @property
    def error(self) -> TritonError | None:
        errs = [r.error() for r in self.responses if r.has_error()]
        return errs[-1] if errs else None

    def outputs(self, name: str) -> list[np.ndarray]:
        """The ``name`` output of every response that has one, in order."""
        found = []
        for r in self.responses:
            t = get_output_tensor_by_name(r, name)
            if t is not None:
                found.append(t.as_numpy())
        return found


class FakeTriton:
    """Plays pb_utils (pass it where a model takes ``pb``) and the server around the models."""

    current: FakeTriton | None = None

    # the pb_utils surface, as attributes
    Tensor = Tensor
    InferenceResponse = InferenceResponse
    TritonError = TritonError
    TritonModelException = TritonModelException
    Logger = Logger
    MetricFamily = MetricFamily
    TRITONSERVER_RESPONSE_COMPLETE_FINAL = TRITONSERVER_RESPONSE_COMPLETE_FINAL
    get_input_tensor_by_name = staticmethod(get_input_tensor_by_name)
    get_output_tensor_by_name = staticmethod(get_output_tensor_by_name)
    using_decoupled_model_transaction_policy = staticmethod(using_decoupled_model_transaction_policy)

    def __init__(self) -> None:
        self._models: dict[str, _Model] = {}
        self.bls_calls: dict[str, int] = {}
        self.down: set[str] = set()  # models that fail every request, like a dead stub
        FakeTriton.current = self

    def InferenceRequest(self, **kwargs: Any) -> InferenceRequest:  # noqa: N802 (pb_utils' name)
        return InferenceRequest(_server=self, **kwargs)

    def is_model_ready(self, model_name: str, model_version: str = "") -> bool:
        return model_name in self._models and model_name not in self.down

    # -- models ----------------------------------------------------------------------

    def add_model(self, name: str, instance: Any, config: dict, initialize: bool = True) -> Any:
        """Register ``instance`` under ``name``; run its ``initialize`` with Triton's ``args``."""
        config = {**config, "name": name}
        if initialize:
            instance.initialize(
                {
                    "model_config": json.dumps(config),
                    "model_instance_kind": "CPU",
                    "model_instance_name": f"{name}_0",
                    "model_instance_device_id": "0",
                    "model_repository": "",
                    "model_version": "1",
                    "model_name": name,
                }
            )
        self._models[name] = _Model(name, instance, config)
        return instance

    def finalize(self) -> None:
        for m in self._models.values():
            if hasattr(m.instance, "finalize"):
                m.instance.finalize()
        if FakeTriton.current is self:
            FakeTriton.current = None

    def client_request(
        self, model: str, inputs: Mapping[str, Any], request_id: str = "", parameters: Mapping | None = None
    ) -> ClientCall:
        """A request as a client would send it (batch dimension added where the model batches)."""
        cfg = self._models[model].config
        batched = int(cfg.get("max_batch_size", 0)) > 0
        tensors = []
        for name, value in inputs.items():
            arr = value if isinstance(value, np.ndarray) else _to_array(name, value, cfg)
            if batched and not isinstance(value, np.ndarray):
                arr = arr.reshape((1, *arr.shape))
            tensors.append(Tensor(name, arr))
        req = InferenceRequest(model_name=model, inputs=tensors, request_id=request_id, parameters=parameters)
        return ClientCall(req)

    def execute(self, model: str, calls: list[ClientCall]) -> list[ClientCall]:
        """Deliver ``calls`` to ``model`` in ONE ``execute`` (as dynamic batching does).

        Requests Triton would reject before the model (missing or unknown
        inputs, wrong data type) get that error here and are not delivered.
        """
        m = self._models[model]
        delivered = []
        for c in calls:
            err = _check_inputs(m.config, c.request)
            if err is not None:
                c.sender.send(InferenceResponse(error=TritonError(err, TritonError.INVALID_ARG)),
                              flags=TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            else:
                delivered.append(c.request)
        if delivered:
            with m.lock:
                out = m.instance.execute(delivered)
            if using_decoupled_model_transaction_policy(m.config):
                assert out is None, f"decoupled model '{model}' returned responses from execute"
            else:
                assert out is not None and len(out) == len(delivered), "one response per request"
                for req, resp in zip(delivered, out):
                    req.get_response_sender().send(resp, flags=TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return calls

    def bls(self, request: InferenceRequest) -> InferenceResponse:
        name = request.model_name
        self.bls_calls[name] = self.bls_calls.get(name, 0) + 1
        m = self._models.get(name)
        if m is None or name in self.down:
            return InferenceResponse(
                error=TritonError(f"Failed for execute the inference request. Model '{name}' is not ready.",
                                  TritonError.UNAVAILABLE)
            )
        # Crossing a process boundary: the callee gets its own copies.
        inputs = [Tensor(t.name(), np.array(t.as_numpy(), copy=True)) for t in request.inputs()]
        incoming = InferenceRequest(model_name=name, inputs=inputs, request_id=request.request_id())
        err = _check_inputs(m.config, incoming)
        if err is not None:
            return InferenceResponse(error=TritonError(err, TritonError.INVALID_ARG))
        with m.lock:
            out = m.instance.execute([incoming])
        assert out is not None and len(out) == 1, f"model '{name}' must return one response per request"
        resp = out[0]
        if resp.has_error():
            return resp
        wanted = request.requested_output_names()
        tensors = [Tensor(t.name(), np.array(t.as_numpy(), copy=True)) for t in resp.output_tensors()
                   if not wanted or t.name() in wanted]
        return InferenceResponse(output_tensors=tensors)


def _to_array(name: str, value: Any, config: Mapping) -> np.ndarray:
    spec = next((i for i in config.get("input", []) if i["name"] == name), None)
    dtype = CONFIG_DTYPES[spec["data_type"]] if spec else None
    values = value if isinstance(value, (list, tuple)) else [value]
    if dtype is np.object_ or (dtype is None and all(isinstance(v, (str, bytes)) for v in values)):
        return np.array([v.encode() if isinstance(v, str) else v for v in values], dtype=np.object_)
    return np.array(values, dtype=dtype)


def _check_inputs(config: Mapping, request: InferenceRequest) -> str | None:
    """What Triton rejects before a model sees the request, with a message like Triton's."""
    specs = {i["name"]: i for i in config.get("input", [])}
    given = {t.name(): t for t in request.inputs()}
    model = config.get("name", "?")
    for name in given:
        if name not in specs:
            return f"unexpected inference input '{name}' for model '{model}'"
    for name, spec in specs.items():
        if name not in given:
            if not spec.get("optional", False):
                return f"missing required input '{name}' for model '{model}'"
            continue
        arr = given[name].as_numpy()
        want = np.dtype(CONFIG_DTYPES[spec["data_type"]])
        if arr.dtype != want and not (want == np.object_ and arr.dtype.kind in "OSU"):
            return f"inference input '{name}' data-type is '{arr.dtype}', but model '{model}' expects '{spec['data_type']}'"
        batched = int(config.get("max_batch_size", 0)) > 0
        dims = [int(d) for d in spec["dims"]]  # Triton's JSON writes int64 dims as strings
        shape = list(arr.shape[1:] if batched else arr.shape)
        if len(shape) != len(dims) or any(d != -1 and d != s for d, s in zip(dims, shape)):
            return f"unexpected shape for input '{name}' for model '{model}'. Expected {dims}, got {list(arr.shape)}"
    return None


def fake_deployment(
    target: str | Path,
    draft: str | Path | None = None,
    *,
    warmup: bool = False,
    max_sessions: int = 64,
    **spec_decode_options: Any,
) -> FakeTriton:
    """``target``, ``draft`` (optional) and ``spec_decode`` in this process, configured as
    :func:`trtspec.builder.repo.write_model_repo` would configure them, talking through BLS."""
    from trtspec.builder.repo import checkpoint_facts, lm_config, spec_decode_config
    from trtspec.serving.triton import lm, spec_decode

    target_dir, vocab, target_ctx = checkpoint_facts(Path(target), None)
    pb = FakeTriton()
    pb.add_model("target", lm.TritonPythonModel(pb),
                 lm_config("target", checkpoint=str(target_dir), warmup=warmup, max_sessions=max_sessions))
    draft_ctx = None
    if draft is not None:
        draft_dir, _, draft_ctx = checkpoint_facts(Path(draft), None)
        pb.add_model("draft", lm.TritonPythonModel(pb),
                     lm_config("draft", checkpoint=str(draft_dir), warmup=warmup, max_sessions=max_sessions))
    options = {"warmup": warmup, **spec_decode_options}
    pb.add_model("spec_decode", spec_decode.TritonPythonModel(pb),
                 spec_decode_config(tokenizer_dir=str(target_dir), vocab_size=vocab, target_max_context=target_ctx,
                                    draft_max_context=draft_ctx, **options))
    return pb


# -- helpers for tests of spec_decode ----------------------------------------------------------


def run_batch(pb: FakeTriton, requests: list[dict], model: str = "spec_decode") -> list[ClientCall]:
    """``requests`` in ONE execute (as dynamic batching delivers them); each waited for, and
    checked to have received the final flag exactly once."""
    calls = [pb.client_request(model, r, request_id=f"r{i}") for i, r in enumerate(requests)]
    pb.execute(model, calls)
    for c in calls:
        c.wait(60)
        assert c.sender.final_count == 1, "final flag exactly once per request"
    return calls


def final_value(call: ClientCall, name: str) -> Any:
    """Output ``name`` of the final response: ``output_ids`` as an array, others as a scalar."""
    (arr,) = call.outputs(name)[-1:]
    assert arr.shape[0] == 1, "batch-first outputs"
    v = arr.reshape(-1)
    return v if name == "output_ids" else v[0]


def text_of(call: ClientCall) -> str:
    """All ``text_output`` of a request, joined."""
    return "".join(t.reshape(-1)[0].decode() for t in call.outputs("text_output"))
