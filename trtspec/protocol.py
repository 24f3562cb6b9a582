"""The wire interface of the three Triton models, written down once (shared by
``trtspec.build``, which renders the configs, and ``trtspec.serving``, which speaks it).

The repository writer renders ``config.pbtxt`` from these specs, the models
read their inputs by these names, and the client sends them. The client
interface follows the TensorRT-LLM Triton conventions (``text_input``,
``max_tokens``, ``stream``, ... -> ``text_output``; ``max_batch_size > 0`` with
``dims: [1]``, so a request carries shape ``[1, 1]``), so existing Triton LLM
clients and Triton's HTTP ``generate``/``generate_stream`` endpoints work.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

SPEC_DECODE = "spec_decode"
TARGET = "target"
DRAFT = "draft"


PRIORITIES = ("high", "normal", "low")


class Speculation(str, enum.Enum):
    """Per-request speculation switch."""

    auto = "auto"  # the server decides (today: speculate whenever a draft model is deployed)
    on = "on"  # speculate; an error if the deployment has no draft
    off = "off"  # target alone


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
    TensorSpec("seed", "TYPE_INT64", (1,), True, "sampling seed, >= 0"),
    TensorSpec("random_seed", "TYPE_UINT64", (1,), True, "TensorRT-LLM's name for seed"),
    TensorSpec("stop_words", "TYPE_STRING", (-1,), True, "stop strings; empty strings are ignored"),
    TensorSpec("bad_words", "TYPE_STRING", (-1,), True, "TensorRT-LLM compatibility: only empty values accepted"),
    TensorSpec("priority", "TYPE_STRING", (1,), True, "high | normal (default) | low: routing and admission"),
    TensorSpec("speculation", "TYPE_STRING", (1,), True, "auto (default) | on | off"),
)

SPEC_DECODE_OUTPUTS = (
    TensorSpec("text_output", "TYPE_STRING", (-1,), doc="streaming: the new text; otherwise the whole output"),
    TensorSpec("finish_reason", "TYPE_STRING", (1,), doc="final response: length | stop | context | cancelled"),
    TensorSpec("num_input_tokens", "TYPE_INT32", (1,), doc="final response: prompt tokens"),
    TensorSpec("num_output_tokens", "TYPE_INT32", (1,), doc="final response: emitted tokens"),
    TensorSpec("num_draft_tokens", "TYPE_INT32", (1,), doc="final response: drafted tokens"),
    TensorSpec("num_accepted_tokens", "TYPE_INT32", (1,), doc="final response: accepted drafted tokens"),
    TensorSpec("acceptance_rate", "TYPE_FP32", (1,), doc="final response: accepted / drafted (0 when nothing was drafted)"),
    TensorSpec("output_ids", "TYPE_INT64", (-1,), doc="final response: the emitted token ids"),
)

# Outputs only the final response of a request carries.
FINAL_OUTPUTS = tuple(s.name for s in SPEC_DECODE_OUTPUTS if s.name != "text_output")

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
