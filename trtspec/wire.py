"""The wire interface of the three Triton models, written down once (shared by
``trtspec.builder``, which renders the configs, and ``trtspec.serving``, which speaks it).

The repository writer renders ``config.pbtxt`` from these specs, the models
read their inputs by these names, and the client sends them. The client
interface follows the TensorRT-LLM Triton conventions (``text_input``,
``max_tokens``, ``stream``, ... -> ``text_output``; ``max_batch_size > 0`` with
``dims: [1]``, so a request carries shape ``[1, 1]``), so existing Triton LLM
clients and Triton's HTTP ``generate``/``generate_stream`` endpoints work.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping, Sequence
from dataclasses import MISSING, dataclass, field, fields
from typing import Any, get_type_hints

import numpy as np

from trtspec.decoding.types import DrafterKind

SPEC_DECODE = "spec_decode"
TARGET = "target"
DRAFT = "draft"


class Priority(str, enum.Enum):
    """A request's priority: routing rules and admission shares read it."""

    HIGH = "high"
    NORMAL = "normal"
    LOW = "low"


class Speculation(str, enum.Enum):
    """A request's speculation switch. ``off`` always wins; ``on`` skips the router and the canary draw."""

    AUTO = "auto"  # the control plane decides (routing, rollout, breaker, admission)
    ON = "on"  # speculate; an error if the deployment has no draft
    OFF = "off"  # the target alone


@dataclass(frozen=True)
class TensorSpec:
    name: str
    data_type: str  # Triton config type: TYPE_STRING, TYPE_INT32, ...
    dims: tuple[int, ...]
    optional: bool = False
    doc: str = ""

    def to_config(self) -> dict:
        d: dict = {"name": self.name, "data_type": self.data_type, "dims": list(self.dims)}
        if self.optional:
            d["optional"] = True
        return d


# -- spec_decode: the client interface --------------------------------------
# Shapes below exclude the batch dimension (max_batch_size > 0): a client sends
# [1, 1] and receives [1, 1] (``output_ids``: [1, n]); one prompt per request.

SPEC_DECODE_INPUTS = (
    TensorSpec("text_input", "TYPE_STRING", (1,), doc="prompt text (UTF-8)"),
    TensorSpec("max_tokens", "TYPE_INT32", (1,), doc="most new tokens, 1..max_tokens_limit"),
    TensorSpec("stream", "TYPE_BOOL", (1,), True, "true: one response per draft-verify iteration"),
    TensorSpec("temperature", "TYPE_FP32", (1,), True, "0 (default) is greedy"),
    TensorSpec("top_k", "TYPE_INT32", (1,), True, "0 (default) disables top-k"),
    TensorSpec("top_p", "TYPE_FP32", (1,), True, "1.0 (default) disables nucleus sampling"),
    TensorSpec("seed", "TYPE_UINT64", (1,), True, "sampling seed (UINT64, as TensorRT-LLM's)"),
    TensorSpec("random_seed", "TYPE_UINT64", (1,), True, "TensorRT-LLM's name for seed"),
    TensorSpec("exact", "TYPE_BOOL", (1,), True,
               "sampling: position-keyed draws, so a seed gives the same output with speculation on or off "
               "(default: the policy's exact; greedy output is exact when the target's exact parameter is on; "
               "docs/runtime.md)"),
    TensorSpec("stop_words", "TYPE_STRING", (-1,), True, "stop strings; empty strings are ignored"),
    TensorSpec("bad_words", "TYPE_STRING", (-1,), True, "words the text never contains (each as its tokens)"),
    TensorSpec("priority", "TYPE_STRING", (1,), True, "high | normal (default) | low: routing and admission"),
    TensorSpec("speculation", "TYPE_STRING", (1,), True, "auto (default) | on | off"),
    TensorSpec("drafter", "TYPE_STRING", (1,), True,
               "model | ngram | suffix | auto: what drafts (default: the model's default_drafter)"),
    TensorSpec("apply_chat_template", "TYPE_BOOL", (1,), True,
               "wrap text_input in the chat template (default: the model's apply_chat_template parameter); "
               "false: text_input is the whole prompt, already rendered"),
    # TensorRT-LLM's tensorrt_llm_bls / ensemble inputs, with their types, so that their clients'
    # requests pass Triton's checks; trtspec.serving.request honours each or refuses the values it
    # cannot honour (docs/serving.md, "TensorRT-LLM clients").
    TensorSpec("exclude_input_in_output", "TYPE_BOOL", (1,), True,
               "false: a whole (not streamed) answer starts with text_input; absent or true: it does not"),
    TensorSpec("end_id", "TYPE_INT32", (1,), True, "end-of-sequence token (default: the tokenizer's EOS; -1: none)"),
    TensorSpec("pad_id", "TYPE_INT32", (1,), True, "accepted; one sequence per response, never padded"),
    TensorSpec("length_penalty", "TYPE_FP32", (1,), True, "accepted; a beam-search setting, no effect on one beam"),
    TensorSpec("repetition_penalty", "TYPE_FP32", (1,), True,
               "logits of ids already in the text divided by it (> 0; 1.0: none; docs/serving.md)"),
    TensorSpec("presence_penalty", "TYPE_FP32", (1,), True,
               "subtracted from logits of ids already in the text (0: none)"),
    TensorSpec("frequency_penalty", "TYPE_FP32", (1,), True,
               "times each id's count in the text, subtracted from its logit (0: none)"),
    TensorSpec("logit_bias_ids", "TYPE_INT64", (-1,), True,
               "token ids whose logits get logit_bias_values added, before the temperature and the penalties"),
    TensorSpec("logit_bias_values", "TYPE_FP32", (-1,), True, "one value per logit_bias_ids (OpenAI's logit_bias)"),
    TensorSpec("min_length", "TYPE_INT32", (1,), True, "TensorRT-LLM's older name of min_tokens"),
    TensorSpec("min_tokens", "TYPE_INT32", (1,), True, "no EOS among the first this many tokens (0..max_tokens)"),
    TensorSpec("beam_width", "TYPE_INT32", (1,), True, "1 only"),
    TensorSpec("num_return_sequences", "TYPE_INT32", (1,), True, "1 only"),
    TensorSpec("return_log_probs", "TYPE_BOOL", (1,), True,
               "true: output_log_probs and cum_log_probs sent (each token's log-probability; docs/serving.md)"),
    TensorSpec("top_logprobs", "TYPE_INT32", (1,), True,
               "with return_log_probs: also the N (0..20) most likely tokens at each position (top_output_ids, "
               "top_log_probs)"),
    TensorSpec("return_context_logits", "TYPE_BOOL", (1,), True, "false only"),
    TensorSpec("return_generation_logits", "TYPE_BOOL", (1,), True, "false only"),
    TensorSpec("return_perf_metrics", "TYPE_BOOL", (1,), True, "accepted; the draft counts are always sent"),
    TensorSpec("return_num_input_tokens", "TYPE_BOOL", (1,), True, "accepted; num_input_tokens is always sent"),
    TensorSpec("return_num_output_tokens", "TYPE_BOOL", (1,), True, "accepted; num_output_tokens is always sent"),
    TensorSpec("num_draft_tokens", "TYPE_INT32", (1,), True, "at most this many drafted tokens per step; 0: no speculation"),
    TensorSpec("use_draft_logits", "TYPE_BOOL", (1,), True, "accepted; either way the output is distributed as the target's"),
    TensorSpec("decoder_text_input", "TYPE_STRING", (1,), True, "encoder-decoder models only: refused"),
    TensorSpec("image_input", "TYPE_FP16", (-1, 3, -1, -1), True, "multimodal: refused"),
    TensorSpec("image_bytes_input", "TYPE_UINT8", (-1, -1, -1, -1), True, "multimodal: refused"),
    TensorSpec("image_url_input", "TYPE_STRING", (1,), True, "multimodal: refused"),
    TensorSpec("image_sizes_input", "TYPE_INT64", (-1, 2), True, "multimodal: refused"),
    TensorSpec("video_bytes_input", "TYPE_UINT8", (-1, -1, -1, -1), True, "multimodal: refused"),
    TensorSpec("prompt_embedding_table", "TYPE_FP16", (-1, -1), True, "prompt tuning: refused"),
    TensorSpec("prompt_vocab_size", "TYPE_INT32", (1,), True, "prompt tuning: refused"),
    TensorSpec("prompt_table_extra_id", "TYPE_UINT64", (1,), True, "prompt tuning: refused"),
    TensorSpec("embedding_bias_words", "TYPE_STRING", (-1,), True,
               "words whose tokens' logits get embedding_bias_weights added (TensorRT-LLM's embedding bias)"),
    TensorSpec("embedding_bias_weights", "TYPE_FP32", (-1,), True, "one weight per embedding_bias_words"),
    TensorSpec("lora_task_id", "TYPE_UINT64", (1,), True, "LoRA: refused"),
    TensorSpec("lora_weights", "TYPE_FP16", (-1, -1), True, "LoRA: refused"),
    TensorSpec("lora_config", "TYPE_INT32", (-1, 3), True, "LoRA: refused"),
    TensorSpec("guided_decoding_guide_type", "TYPE_STRING", (1,), True, "guided decoding: refused"),
    TensorSpec("guided_decoding_guide", "TYPE_STRING", (1,), True, "guided decoding: refused"),
)

SPEC_DECODE_OUTPUTS = (
    TensorSpec("text_output", "TYPE_STRING", (-1,), doc="streaming: the new text; otherwise the whole output"),
    TensorSpec("finish_reason", "TYPE_STRING", (1,), doc="final response: length | stop | context | cancelled"),
    TensorSpec("num_input_tokens", "TYPE_INT32", (1,), doc="final response: prompt tokens"),
    TensorSpec("num_output_tokens", "TYPE_INT32", (1,), doc="final response: emitted tokens"),
    TensorSpec("num_draft_tokens", "TYPE_INT32", (1,), doc="final response: drafted tokens"),
    TensorSpec("num_accepted_tokens", "TYPE_INT32", (1,), doc="final response: accepted drafted tokens"),
    TensorSpec("acceptance_rate", "TYPE_FP32", (1,), doc="final response: accepted / drafted (0 when nothing was drafted)"),
    TensorSpec("output_ids", "TYPE_INT64", (-1,), doc="final response: the emitted token ids (streamed with "
               "return_log_probs, each response's own too)"),
    # TensorRT-LLM's names, for its clients
    TensorSpec("total_draft_tokens", "TYPE_INT32", (1,), doc="final response: num_draft_tokens"),
    TensorSpec("total_accepted_draft_tokens", "TYPE_INT32", (1,), doc="final response: num_accepted_tokens"),
    TensorSpec("batch_index", "TYPE_INT32", (1,), doc="every response: 0 (one prompt per request)"),
    TensorSpec("sequence_index", "TYPE_INT32", (1,), doc="every response: 0 (one sequence per request)"),
    TensorSpec("cum_log_probs", "TYPE_FP32", (-1,), doc="final response, with return_log_probs: the sum of output_log_probs"),
    TensorSpec("top_output_ids", "TYPE_INT64", (-1, -1),
               doc="with top_logprobs N ([1, n, N]): at each output position the N most likely tokens, best first; "
                   "-1 pads a position where fewer could be chosen; sent beside output_log_probs"),
    TensorSpec("top_log_probs", "TYPE_FP32", (-1, -1), doc="their log-probabilities ([1, n, N]; pads: the lowest float)"),
    TensorSpec("output_log_probs", "TYPE_FP32", (-1, -1),
               doc="with return_log_probs ([1, 1, n]): each output token's log-probability; streamed, a response's "
                   "own tokens (output_ids beside them), the final response the whole output's"),
)

# top_output_ids / top_log_probs: a position where fewer than N tokens could be chosen is padded
TOP_PAD_ID = -1
TOP_PAD_LOGPROB = float(np.finfo(np.float32).min)


def top_arrays(top: Sequence[Sequence[tuple[int, float]]]) -> tuple[np.ndarray, np.ndarray]:
    """Each position's ``(id, logprob)`` pairs as ``[positions, N]`` arrays (INT64 ids, FP32 log-probabilities),
    padded to the longest (N)."""
    n = max((len(row) for row in top), default=0)
    ids = np.full((len(top), n), TOP_PAD_ID, dtype=np.int64)
    values = np.full((len(top), n), TOP_PAD_LOGPROB, dtype=np.float32)
    for i, row in enumerate(top):
        for j, (token, logprob) in enumerate(row):
            ids[i, j], values[i, j] = token, logprob
    return ids, values


def top_pairs(ids: np.ndarray, values: np.ndarray) -> list[list[tuple[int, float]]]:
    """:func:`top_arrays` read back (``[positions, N]`` each), the pads dropped."""
    return [[(int(t), float(v)) for t, v in zip(row_ids, row_values) if t != TOP_PAD_ID]
            for row_ids, row_values in zip(ids, values)]


# Outputs every response carries (the others: the final response only, or never).
EVERY_RESPONSE_OUTPUTS = ("text_output", "batch_index", "sequence_index")

# -- draft / target: the BLS protocol ------------------------------------------
# Stateless from the caller's view: every call names the WHOLE sequence the
# model should have in its cache afterwards; the model keeps the longest
# common prefix with what it holds (that is the rollback) and feeds the rest.

LM_INPUTS = (
    TensorSpec("session_id", "TYPE_STRING", (1,), doc="one sequence; unknown ids start a fresh cache"),
    TensorSpec("token_ids", "TYPE_INT64", (-1,), doc="the whole sequence to hold after the call"),
    TensorSpec("num_logits", "TYPE_INT32", (1,), doc="logits rows wanted, for the last positions"),
    TensorSpec("release", "TYPE_BOOL", (1,), True, "true: free the session (token_ids may be empty)"),
    # Draft proposals in ONE call (instead of one call per draft token):
    TensorSpec("num_draft", "TYPE_INT32", (1,), True, "k > 0: after token_ids, propose k tokens (outputs draft_*)"),
    TensorSpec("temperature", "TYPE_FP32", (1,), True, "with num_draft: 0 (default) greedy, else sampled"),
    TensorSpec("top_k", "TYPE_INT32", (1,), True, "with num_draft: 0 (default) disables top-k"),
    TensorSpec("top_p", "TYPE_FP32", (1,), True, "with num_draft: 1.0 (default) disables nucleus sampling"),
    TensorSpec("seed", "TYPE_INT64", (1,), True, "with num_draft, sampling: seed of the draft's generator"),
    TensorSpec("exact_seed", "TYPE_UINT64", (1,), True,
               "with num_draft, sampling in exact mode: the request's seed; each draft is drawn with the noise "
               "the target's draw at its position uses (docs/runtime.md), instead of from the generator"),
    TensorSpec("repetition_penalty", "TYPE_FP32", (1,), True, "with num_draft: the request's penalties over the "
               "whole sequence and the drafts before, as the target applies them (1.0, 0, 0: none)"),
    TensorSpec("presence_penalty", "TYPE_FP32", (1,), True, "with num_draft: as repetition_penalty"),
    TensorSpec("frequency_penalty", "TYPE_FP32", (1,), True, "with num_draft: as repetition_penalty"),
    TensorSpec("logit_bias_ids", "TYPE_INT64", (-1,), True,
               "with num_draft: the request's logit bias, added to these ids' logits before the temperature and "
               "the penalties, as the target adds it"),
    TensorSpec("logit_bias_values", "TYPE_FP32", (-1,), True, "with num_draft: one value per logit_bias_ids"),
    TensorSpec("return_argmax", "TYPE_BOOL", (1,), True,
               "true: output argmax_ids, the argmax of each of the num_logits rows, instead of the logits"),
    TensorSpec("cpu_share", "TYPE_INT32", (1,), True,
               "models computing at the same time (1 by default): a CPU model runs 1/cpu_share of its threads"),
)

LM_OUTPUTS = (
    TensorSpec("logits", "TYPE_FP32", (-1, -1), doc="float32 [num_logits, vocab] ([0, vocab] when proposing)"),
    TensorSpec("draft_ids", "TYPE_INT64", (-1,), doc="with num_draft: the k proposed tokens (else empty)"),
    TensorSpec("draft_probs", "TYPE_FP32", (-1, -1), doc="with num_draft, sampling: [k, vocab] q rows (else [0, vocab])"),
    TensorSpec("argmax_ids", "TYPE_INT64", (-1,), doc="with return_argmax: [num_logits] argmax tokens (else empty)"),
)

# Triton error codes by name, for messages and the client.
INVALID_ARG = "INVALID_ARG"
UNAVAILABLE = "UNAVAILABLE"
CANCELLED = "CANCELLED"
INTERNAL = "INTERNAL"


# -- model parameters: one typed config per served model --------------------------
# ``config.pbtxt`` carries them as strings (``parameters { key: ... value: { string_value: ... } }``).
# The dataclass fields below are the only place a key, its type, default and meaning are
# written: the builder renders them (``to_parameters``), the models parse them
# (``from_parameters``: unknown keys refused, values parsed by the field's type, an empty
# value is the default) and docs/serving.md shows ``docs_table()``.


def param(default: Any = MISSING, doc: str = "") -> Any:
    """A model parameter: its default (none: required) and the line the docs table shows."""
    return field(default=default, metadata={"doc": doc})


class ModelParams:
    """Parsing, rendering and the docs table of a served model's parameter dataclass."""

    @classmethod
    def keys(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))  # type: ignore[arg-type]

    @classmethod
    def from_parameters(cls, params: Mapping[str, str], model: str) -> Any:
        """The model's config from its ``config.pbtxt`` parameters; ``ValueError`` (one line) if wrong."""
        unknown = sorted(set(params) - set(cls.keys()))
        if unknown:
            raise ValueError(f"model '{model}': unknown parameter(s) {', '.join(unknown)}; "
                             f"allowed: {', '.join(cls.keys())}")
        types = get_type_hints(cls)
        values: dict[str, Any] = {}
        missing = []
        for f in fields(cls):  # type: ignore[arg-type]
            raw = str(params.get(f.name, ""))
            if raw.strip() == "":
                if f.default is MISSING:
                    missing.append(f.name)
                continue
            values[f.name] = _parse_value(f.name, raw, types[f.name])
        if missing:
            raise ValueError(f"model '{model}': parameter(s) {', '.join(missing)} required in config.pbtxt")
        config = cls(**values)
        config.check(model)
        return config

    def check(self, model: str) -> None:
        """Rules between values (ranges, choices); ``ValueError`` naming the parameter."""

    def to_parameters(self) -> dict[str, str]:
        """Every parameter as the string ``config.pbtxt`` holds (booleans as true/false)."""
        return {f.name: render_value(getattr(self, f.name)) for f in fields(self)}  # type: ignore[arg-type]

    @classmethod
    def docs_table(cls) -> str:
        """The markdown table of docs/serving.md: key, default, meaning."""
        rows = ["| key | default | meaning |", "|---|---|---|"]
        for f in fields(cls):  # type: ignore[arg-type]
            default = "required" if f.default is MISSING else (render_value(f.default) or "empty")
            rows.append(f"| `{f.name}` | {default} | {f.metadata.get('doc', '')} |")
        return "\n".join(rows) + "\n"


def render_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)


def _parse_value(key: str, raw: str, kind: type) -> Any:
    if kind is bool:
        v = raw.strip().lower()
        if v in ("1", "true", "yes", "on"):
            return True
        if v in ("0", "false", "no", "off"):
            return False
        raise ValueError(f"model parameter {key!r} must be true or false, got {v!r}")
    if kind is int:
        try:
            return int(raw)
        except ValueError:
            raise ValueError(f"model parameter {key!r} must be an integer, got {raw!r}") from None
    if kind is float:
        try:
            f = float(raw)
        except ValueError:
            raise ValueError(f"model parameter {key!r} must be a number, got {raw!r}") from None
        if not math.isfinite(f):
            raise ValueError(f"model parameter {key!r} must be finite, got {raw!r}")
        return f
    return raw


MODEL_BACKENDS = ("python", "tensorrtllm")
DRAFTERS = tuple(d.value for d in DrafterKind)
MANIFEST_CHECKS = ("full", "quick", "off")


@dataclass(frozen=True, kw_only=True)
class SpecDecodeParams(ModelParams):
    """``spec_decode``'s parameters."""

    tokenizer_dir: str = param(doc="tokenizer of the pair (the writer: the target's)")
    target_model: str = param(TARGET, "target model name")
    draft_model: str = param("", "draft model name; empty: the target alone")
    model_backend: str = param("python", "what `draft`/`target` are: `python` (trtspec's torch models, "
                                         "`LM_INPUTS`) or `tensorrtllm` (TensorRT-LLM engines)")
    vocab_size: int = param(doc="logits rows of both models (the writer: from the checkpoints)")
    target_max_context: int = param(doc="target's context window in tokens (the writer: from the checkpoint)")
    draft_max_context: int = param(0, "draft's context window (required with a draft)")
    max_tokens_limit: int = param(1024, "largest `max_tokens` a request may ask")
    draft_length: int = param(5, "most tokens drafted per iteration (caps the policy's `k_max`)")
    default_drafter: str = param("model", "drafter of requests that name none: `model`, `ngram`, `suffix` "
                                          "or `auto` (the writer: `ngram` when no draft model is deployed)")
    max_concurrency: int = param(8, "requests decoded at once (worker threads)")
    apply_chat_template: bool = param(True, "wrap `text_input` in the tokenizer's chat template")
    warmup: bool = param(True, "warm the loop and tokenizer at load")
    policy_file: str = param("", "control-plane policy file (YAML); empty: the built-in policy")
    manifest_file: str = param("", "build manifest (`engines/<name>/manifest.json`), checked at load")
    manifest_check: str = param("full", "`full`: refuse engines built for another backend, versions or GPU, "
                                        "or whose files changed (sha256); `quick`: sizes instead of hashes; `off`")
    trace_file: str = param("", "rejection trace (JSONL, rotated); empty: no trace")
    trace_sample_rate: float = param(0.01, "share of rejections traced")
    max_queue: int = param(64, "requests waiting for a worker before new ones get `UNAVAILABLE`")
    max_text_bytes: int = param(0, "largest `text_input` in bytes; 0: 32 x `target_max_context`, at least 64 KiB")
    supervise: bool = param(True, "reload a dead draft/target, probe it, resume")
    draft_timeout_s: float = param(0.0, "fixed deadline of a draft call; 0: adaptive")
    draft_timeout_floor_s: float = param(0.05, "adaptive deadline's floor")
    draft_timeout_max_s: float = param(2.0, "adaptive deadline's ceiling (of its calls' term), and its value "
                                                     "before measurements")
    draft_timeout_multiplier: float = param(4.0, "adaptive deadline = multiplier x (p95 of recent draft calls "
                                                           "+ measured time of the tokens read)")
    draft_late_strikes: int = param(3, "late draft calls in a row that make the supervisor probe it; 0: never")
    target_timeout_s: float = param(30.0, "deadline of a one-token target call; 0: none")
    timeout_per_token_s: float = param(0.05, "added to a call's deadline per token of it and of the calls "
                                             "queued ahead of it")
    prefill_chunk_tokens: int = param(512, "a longer target pass is fed in calls of this many, so other "
                                           "requests' steps run between them; 0: one call")
    probe_timeout_s: float = param(30.0, "deadline of a supervisor probe")
    health_interval_s: float = param(5.0, "probe a model that answered nothing for this long; 0: never")
    reload_backoff_initial_s: float = param(1.0, "wait before the 2nd reload attempt, doubling")
    reload_backoff_max_s: float = param(60.0, "longest wait between reload attempts")

    @property
    def text_limit_bytes(self) -> int:
        return self.max_text_bytes or max(64 * 1024, 32 * self.target_max_context)

    def check(self, model: str) -> None:
        if self.max_queue < 0 or self.max_text_bytes < 0 or self.probe_timeout_s <= 0:
            raise ValueError(f"{model}: max_queue >= 0, max_text_bytes >= 0, probe_timeout_s > 0 required")
        if self.timeout_per_token_s < 0 or self.prefill_chunk_tokens < 0:
            raise ValueError(f"{model}: timeout_per_token_s >= 0 and prefill_chunk_tokens >= 0 required")
        for key, choices in (("manifest_check", MANIFEST_CHECKS), ("model_backend", MODEL_BACKENDS),
                             ("default_drafter", DRAFTERS)):
            value = getattr(self, key)
            if value not in choices:
                raise ValueError(f"{model}: {key} must be one of {', '.join(choices)}, got {value!r}")
        if self.draft_model and self.draft_max_context <= 0:
            raise ValueError(f"{model}: draft_max_context is required with a draft_model")
        if self.draft_length < 0 or self.max_concurrency < 1 or self.max_tokens_limit < 1:
            raise ValueError(f"{model}: draft_length >= 0, max_concurrency >= 1, max_tokens_limit >= 1 required")


@dataclass(frozen=True, kw_only=True)
class LMParams(ModelParams):
    """``draft``'s and ``target``'s parameters (the torch backend); ``fault_*`` for the draft only."""

    checkpoint: str = param(doc="HF directory or `.gguf` file")
    precision: str = param("auto", "auto, fp32, bf16, fp16, int8 or int4 (CPU)")
    device: str = param("auto", "auto, cpu or cuda[:N]")
    max_context: int = param(0, "most tokens per sequence; 0: the checkpoint's")
    max_sessions: int = param(64, "KV caches kept before the least recently used is evicted")
    num_threads: int = param(0, "torch intra-op threads; 0: torch's default")
    warmup: bool = param(True, "run a dummy sequence at load")
    exact: str = param("auto", "auto (on with CUDA), on or off: every pass the same rows, so the target's "
                       "output does not change with speculation (docs/runtime.md)")
    fault_wrong_share: float = param(0.0, "share of drafted tokens replaced by a wrong one")
    fault_fail_share: float = param(0.0, "share of forward passes that raise")
    fault_delay_s: float = param(0.0, "delay added to a forward pass (the draft's or the target's)")
    fault_delay_share: float = param(1.0, "share of forward passes delayed")
    fault_seed: int = param(0, "seed of the fault draws")

    @property
    def has_faults(self) -> bool:
        return bool(self.fault_wrong_share or self.fault_fail_share or self.fault_delay_s)

    @property
    def exact_mode(self) -> bool | None:
        """``exact`` as ``load_model`` takes it (``None``: the device's default)."""
        return {"auto": None, "on": True, "off": False}[self.exact]

    def check(self, model: str) -> None:
        if self.exact not in ("auto", "on", "off"):
            raise ValueError(f"model '{model}': parameter 'exact' must be auto, on or off, got {self.exact!r}")
        for key in ("fault_wrong_share", "fault_fail_share", "fault_delay_share"):
            v = getattr(self, key)
            if not 0.0 <= v <= 1.0:
                raise ValueError(f"model '{model}': parameter {key!r} must be in [0, 1], got {v}")
        if self.fault_delay_s < 0:
            raise ValueError(f"model '{model}': parameter 'fault_delay_s' must be >= 0, got {self.fault_delay_s}")
        if model == TARGET and (self.fault_wrong_share or self.fault_fail_share):
            raise ValueError("model 'target': wrong tokens and failures are injected into the draft only "
                             "(they would change outputs); a delay may slow either")
