"""A stand-in for a TensorRT-LLM engine on Triton's ``tensorrtllm`` backend, for machines without a GPU.

:class:`TritonPythonModel` is a Python-backend model with the ``tensorrtllm``
model's interface (the config :func:`trtspec.builder.trtllm.tensorrtllm_model_config`
writes, only ``backend: "python"``) and its answers, computed with our torch
runtime on an HF checkpoint (parameter ``emulate_checkpoint``):

- ``input_ids`` + ``request_output_len = m``, no drafts: ``m`` new tokens,
  decoded one at a time;
- with ``draft_input_ids`` (``k`` tokens), as an engine built for external
  draft tokens does: ONE step that scores the ``k + 1`` positions after the
  input, keeps the drafts while they equal the engine's own choice there and
  answers them plus that choice (the correction, or the bonus after all ``k``);
- greedy with ``runtime_top_k = 1`` or without sampling inputs; otherwise
  ``temperature`` / ``runtime_top_k`` / ``runtime_top_p`` warp the logits and
  a generator seeded with ``seed`` draws each position's token;
- ``output_ids [1, 1, L]`` and ``sequence_length [1, 1]``: the new tokens with
  ``exclude_input_in_output``, else the input followed by them.

It runs in a real tritonserver (the end-to-end tests) and in
:class:`~trtspec.testing.fake_triton.FakeTriton`. It re-prefills every request
(a real engine finds the prefix in its reused KV blocks); what it answers is
what matters here. Every request is recorded in ``requests`` for tests.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from trtspec.serving.triton import load_pb_utils, model_parameters
from trtspec.decoding.acceptance import sample, warp_probs
from trtspec.decoding.types import SamplingParams

SHIM_MODULE = "trtspec.testing.fake_trtllm"


@dataclass(frozen=True)
class EngineRequest:
    """What one request asked of the emulated engine."""

    input_len: int
    max_new: int
    drafts: tuple[int, ...]
    greedy: bool
    seed: int | None


class TritonPythonModel:
    def __init__(self, pb: Any = None) -> None:
        self._pb_override = pb
        self.pb: Any = None
        self.lm: Any = None
        self.name = "tensorrtllm"
        self.requests: list[EngineRequest] = []

    def initialize(self, args: dict) -> None:
        from trtspec.runtime.torch.loader import load_model

        self.pb = load_pb_utils(self._pb_override)
        config = json.loads(args["model_config"])
        self.name = args.get("model_name") or config.get("name", self.name)
        checkpoint = model_parameters(config).get("emulate_checkpoint", "")
        if not checkpoint:
            raise ValueError(f"model '{self.name}': parameter 'emulate_checkpoint' is required")
        if self._pb_override is None:
            torch.set_num_threads(1)
        self.lm = load_model(checkpoint, "fp32", "cpu").lm

    def execute(self, requests: list) -> list:
        pb = self.pb
        responses = []
        for request in requests:
            try:
                out = self._one(request)
            except ValueError as e:
                responses.append(pb.InferenceResponse(error=pb.TritonError(str(e), pb.TritonError.INVALID_ARG)))
                continue
            responses.append(pb.InferenceResponse(output_tensors=[
                pb.Tensor("output_ids", np.asarray(out, dtype=np.int32).reshape(1, 1, -1)),
                pb.Tensor("sequence_length", np.array([[len(out)]], dtype=np.int32)),
            ]))
        return responses

    def finalize(self) -> None:
        self.lm = None

    def _get(self, request: Any, name: str) -> np.ndarray | None:
        t = self.pb.get_input_tensor_by_name(request, name)
        return None if t is None else t.as_numpy().reshape(-1)

    def _one(self, request: Any) -> list[int]:
        ids = self._get(request, "input_ids")
        max_new = self._get(request, "request_output_len")
        if ids is None or ids.size == 0 or max_new is None or int(max_new[0]) < 1:
            raise ValueError("input_ids (non-empty) and request_output_len >= 1 are required")
        input_ids = [int(t) for t in ids]
        m = int(max_new[0])
        drafts_arr = self._get(request, "draft_input_ids")
        drafts = [int(t) for t in drafts_arr] if drafts_arr is not None else []
        sampling, seed = self._sampling(request)
        self.requests.append(EngineRequest(len(input_ids), m, tuple(drafts), sampling.greedy, seed))
        gen = torch.Generator().manual_seed(seed) if seed is not None else None
        session = self.lm.new_session()
        try:
            if drafts:
                new = self._verify(session, input_ids, drafts, sampling, gen)
            else:
                new = self._decode(session, input_ids, m, sampling, gen)
        finally:
            session.close()
        exclude = self._get(request, "exclude_input_in_output")
        return new if exclude is not None and bool(exclude[0]) else input_ids + new

    def _sampling(self, request: Any) -> tuple[SamplingParams, int | None]:
        top_k, top_p, temp, seed = (self._get(request, n) for n in ("runtime_top_k", "runtime_top_p", "temperature",
                                                                  "seed"))
        k = int(top_k[0]) if top_k is not None else 0
        if k == 1 or (top_k is None and top_p is None and temp is None):
            return SamplingParams(), None
        sampling = SamplingParams(
            temperature=float(temp[0]) if temp is not None else 1.0,
            top_k=k,
            top_p=float(top_p[0]) if top_p is not None else 1.0,
        )
        return sampling, int(seed[0]) if seed is not None else None

    @staticmethod
    def _choose(logits: torch.Tensor, sampling: SamplingParams, gen: torch.Generator | None) -> int:
        if sampling.greedy:
            return int(logits.argmax())
        return sample(warp_probs(logits.reshape(1, -1), sampling)[0], gen)

    def _decode(self, session: Any, input_ids: list[int], m: int, sampling: SamplingParams,
                gen: torch.Generator | None) -> list[int]:
        new: list[int] = []
        logits = session.forward(input_ids, 1)[0]
        while True:
            new.append(self._choose(logits, sampling, gen))
            if len(new) == m:
                return new
            logits = session.forward([new[-1]], 1)[0]

    def _verify(self, session: Any, input_ids: list[int], drafts: list[int], sampling: SamplingParams,
                gen: torch.Generator | None) -> list[int]:
        rows = session.forward(input_ids + drafts, len(drafts) + 1)  # [k + 1, vocab], one pass
        out: list[int] = []
        for i, row in enumerate(rows):
            choice = self._choose(row, sampling, gen)
            out.append(choice)
            if i == len(drafts) or choice != drafts[i]:
                return out
        return out


def emulated_config(base: dict, checkpoint: str | Path) -> dict:
    """A ``tensorrtllm`` model config (JSON form) turned into this Python model's."""
    config = json.loads(json.dumps(base))
    config["backend"] = "python"
    config["parameters"] = {**config.get("parameters", {}),
                            "emulate_checkpoint": {"string_value": str(Path(checkpoint).resolve())}}
    return config


def trtllm_model_configs(target: str | Path, draft: str | Path, max_batch_size: int = 8) -> dict[str, dict]:
    """``target`` and ``draft`` configs as ``trtspec build --backend trtllm`` writes them (their
    ``tensorrtllm`` interface), emulated on the two HF checkpoints."""
    from trtspec.builder.repo import checkpoint_facts
    from trtspec.builder.trtllm import TrtllmModelConfig, tensorrtllm_model_config

    configs = {}
    for name, checkpoint in (("target", target), ("draft", draft)):
        hf_dir, _, ctx = checkpoint_facts(Path(checkpoint), None)
        base = tensorrtllm_model_config(TrtllmModelConfig(
            name=name, engine_dir=Path("/engines") / name, max_batch_size=max_batch_size, max_seq_len=ctx,
            kv_cache_free_gpu_mem_fraction=0.4, max_tokens_in_paged_kv_cache=max_batch_size * ctx,
        ))
        configs[name] = emulated_config(base, hf_dir)
    return configs


def fake_trtllm_deployment(target: str | Path, draft: str | Path, **spec_decode_options: Any) -> Any:
    """``spec_decode`` (``model_backend: tensorrtllm``) over emulated ``target``/``draft`` engines,
    in this process (:class:`~trtspec.testing.fake_triton.FakeTriton`)."""
    from trtspec.builder.repo import checkpoint_facts, spec_decode_config
    from trtspec.serving.triton import spec_decode
    from trtspec.testing.fake_triton import FakeTriton

    pb = FakeTriton()
    for name, config in trtllm_model_configs(target, draft).items():
        pb.add_model(name, TritonPythonModel(pb), config)
    target_dir, vocab, target_ctx = checkpoint_facts(Path(target), None)
    _, _, draft_ctx = checkpoint_facts(Path(draft), None)
    options = {"warmup": False, **spec_decode_options}
    pb.add_model("spec_decode", spec_decode.TritonPythonModel(pb),
                 spec_decode_config(tokenizer_dir=str(target_dir), vocab_size=vocab, target_max_context=target_ctx,
                                    draft_max_context=draft_ctx, model_backend="tensorrtllm", **options))
    return pb


def write_emulated_trtllm_repo(repo_dir: str | Path, target: str | Path, draft: str | Path, **options: Any) -> Path:
    """A model repository as ``trtspec build --backend trtllm`` writes it (``spec_decode`` with
    ``model_backend: tensorrtllm``; ``target``/``draft`` with the ``tensorrtllm`` interface), whose
    engines are emulated by this module, so a real tritonserver without a GPU serves it.
    ``options``: further arguments of :func:`trtspec.builder.repo.write_model_repo`."""
    from trtspec.builder.repo import model_py, render_pbtxt, write_model_repo

    repo = write_model_repo(repo_dir, target_checkpoint=target, draft_checkpoint=draft, model_backend="tensorrtllm",
                            **options)
    for name, config in trtllm_model_configs(target, draft).items():
        (repo / name / "1").mkdir(parents=True, exist_ok=True)
        (repo / name / "config.pbtxt").write_text(render_pbtxt(config))
        (repo / name / "1" / "model.py").write_text(model_py(SHIM_MODULE))
    return repo
