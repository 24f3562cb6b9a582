"""The draft and target as ``tensorrtllm``-backend models (TensorRT-LLM engines), seen from ``spec_decode``.

With ``trtspec build --backend trtllm`` the ``draft`` and ``target`` models are
TensorRT-LLM engines served by Triton's ``tensorrtllm`` backend
(:mod:`trtspec.builder.trtllm` writes their configs). They speak that backend's
interface, not ours (``protocol.LM_INPUTS``): a request carries the whole
sequence (``input_ids``) and asks for ``request_output_len`` new tokens; the
engine answers tokens (``output_ids``), not logits. :class:`TrtllmLanguageModel`
adapts that to the loop's protocols:

- the draft session is a ``DraftProposer``: ``propose`` asks the draft engine
  for ``k`` tokens after the sequence;
- the target session is a ``DraftVerifier``: ``verify`` sends the sequence
  with the drafts as ``draft_input_ids`` and ``request_output_len = k + 1``.
  The target engine, built with ``--speculative_decoding_mode
  draft_tokens_external``, checks the drafts in one step and answers the
  accepted ones plus its own next token (the correction, or the bonus when all
  were kept); ``k == 0`` is a plain one-token step.

Greedy requests send ``runtime_top_k = 1``, so the engine's choice is its
argmax and the output is token for token the target's. Sampled requests send
temperature / top-k / top-p and a fresh ``seed`` per call, and no draft logits:
the engine samples its own token at each position and keeps drafts while they
equal its samples (token matching). Every emitted token is then the target's
own sample, distributed exactly as without speculation, however the drafts were
chosen; the draft therefore always proposes its greedy tokens (its most likely
token is the one most often matched). Acceptance is lower than rejection
sampling with the draft's distribution would give.

There are no sessions on the engine side: every call names the whole sequence
and the engines' KV-cache reuse (``enable_kv_cache_reuse``, paged context
FMHA; both written by the build) finds the cached prefix, so a rollback is
just a shorter sequence next time, and a restarted engine costs time, never
correctness. Neither model gets ``end_id``: the loop applies EOS and stop
rules itself, so the engines answer the number of tokens asked for (a draft
that answers fewer, having ended the sequence, is checked for what it sent).
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from trtspec.serving.triton.bls import BLSError, BLSModel, RemoteSequence, exec_bls
from trtspec.decoding.types import Proposal, SamplingParams

GREEDY = SamplingParams()
OUTPUTS = ["output_ids", "sequence_length"]


class TrtllmLanguageModel(BLSModel):
    """A ``tensorrtllm``-backend model (one engine), called through BLS."""

    def new_session(self, session_id: str = "") -> TrtllmSession:
        return TrtllmSession(self, session_id or uuid.uuid4().hex)

    def probe(self) -> None:
        """A real one-token greedy step on a two-token sequence."""
        self.generate([1, 2], 1, GREEDY, None)

    def generate(
        self,
        input_ids: Sequence[int],
        max_new: int,
        sampling: SamplingParams,
        seed: int | None,
        draft_ids: Sequence[int] = (),
    ) -> list[int]:
        """One request to the engine: the new tokens it answers (1..``max_new`` of them)."""
        pb = self._pb

        def scalar(name: str, value: Any, dtype: Any) -> Any:
            return pb.Tensor(name, np.array([[value]], dtype=dtype))  # [batch 1, 1]

        ids = np.asarray(input_ids, dtype=np.int32).reshape(1, -1)
        inputs = [
            pb.Tensor("input_ids", ids),
            scalar("input_lengths", ids.shape[1], np.int32),
            scalar("request_output_len", max_new, np.int32),
            scalar("exclude_input_in_output", True, np.bool_),
        ]
        if len(draft_ids):
            inputs.append(pb.Tensor("draft_input_ids", np.asarray(draft_ids, dtype=np.int32).reshape(1, -1)))
        if sampling.greedy:
            inputs.append(scalar("runtime_top_k", 1, np.int32))
        else:
            inputs += [
                scalar("temperature", sampling.temperature, np.float32),
                scalar("runtime_top_k", sampling.top_k, np.int32),
                scalar("runtime_top_p", sampling.top_p, np.float32),
            ]
            if seed is not None:
                inputs.append(scalar("seed", seed, np.uint64))
        out, lengths = exec_bls(pb, self.model_name, inputs, OUTPUTS)
        return self._new_tokens(out, lengths, [int(t) for t in ids[0]], max_new)

    def _new_tokens(self, out: np.ndarray, lengths: np.ndarray, input_ids: list[int], max_new: int) -> list[int]:
        """``output_ids [1, beam 1, L]`` + ``sequence_length [1, 1]`` -> the new tokens.

        With ``exclude_input_in_output`` (sent with every request) the engine answers
        only new tokens; an engine that still prefixes the input is understood too."""
        if out.ndim < 2 or out.shape[0] != 1 or lengths.size < 1:
            raise BLSError(f"model '{self.model_name}' returned output_ids of shape {tuple(out.shape)}, "
                           f"expected [1, 1, tokens]")
        row = out.reshape(-1)[: out.shape[-1]]  # batch 0, beam 0
        n = min(int(lengths.reshape(-1)[0]), row.shape[0])
        tokens = [int(t) for t in row[:n]]
        if n > max_new and tokens[: len(input_ids)] == input_ids:
            tokens = tokens[len(input_ids):]
        if not 1 <= len(tokens) <= max_new:
            raise BLSError(f"model '{self.model_name}' answered {len(tokens)} new tokens; asked for 1..{max_new}")
        return tokens


class TrtllmSession(RemoteSequence):
    """One sequence on a :class:`TrtllmLanguageModel`: the tokens the engine is known to have cached.

    A ``DraftProposer`` (the draft) and a ``DraftVerifier`` (the target); it answers no logits.
    """

    def __init__(self, model: TrtllmLanguageModel, session_id: str) -> None:
        super().__init__(model.model_name, model.max_context, session_id)
        self._model = model

    def forward(self, token_ids: Sequence[int], num_logits: int) -> torch.Tensor:
        raise BLSError(
            f"model '{self._model.model_name}' is a TensorRT-LLM engine: it answers tokens, not logits "
            "(spec_decode drives it through propose/verify)"
        )

    def propose(self, token_ids: Sequence[int], k: int, sampling: SamplingParams, seed: int | None,
                text: Sequence[int] = ()) -> Proposal:
        """``k`` draft tokens after the sequence, in one engine request: always the draft's greedy
        choices. The target keeps a draft when it equals its own sample there (token matching), which
        the draft's most likely token does most often; how drafts are chosen never changes the output."""
        context = self._extend(token_ids, k - 1)
        tokens = self._model.generate(context, k, GREEDY, None)  # 1..k: fewer if the engine ended the sequence
        self._tokens = context + tokens[:-1]  # the last draft token is not fed (as propose_locally)
        return Proposal(tokens=tuple(tokens), q=None)  # the target matches tokens; it needs no q

    def verify(
        self, token_ids: Sequence[int], drafted: Sequence[int], sampling: SamplingParams, seed: int | None
    ) -> tuple[int, int]:
        """The target engine checks ``drafted`` after the sequence; (accepted, next token)."""
        k = len(drafted)
        context = self._extend(token_ids, k)
        out = self._model.generate(context, k + 1, sampling, seed, draft_ids=drafted)
        # The engine answers the drafts it kept and then its own token; count the kept ones
        # from the answer, so an engine that decodes on after the check is understood as well.
        n = 0
        while n < min(k, len(out) - 1) and out[n] == int(drafted[n]):
            n += 1
        self._tokens = context + [int(t) for t in drafted[:n]]
        return n, out[n]

    def close(self) -> None:
        """Nothing to free: the engine ends each request itself and keeps reusable blocks LRU."""
        self._closed = True
