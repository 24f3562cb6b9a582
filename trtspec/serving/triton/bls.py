"""The draft and target as seen from ``spec_decode``: language models behind BLS calls.

:class:`BLSLanguageModel` / :class:`BLSSession` implement the loop's
:class:`~trtspec.decoding.protocols.LanguageModel` / ``LMSession`` over the
draft/target protocol (``protocol.LM_INPUTS``). The session keeps the token
list the remote cache should hold: ``forward`` appends and calls the model with
the WHOLE list, ``truncate`` only shortens the list (the model sees the
rollback on the next call, as the common prefix of old and new). The remote
cache is an optimisation: a restarted or evicted model re-prefills, and the
logits are the same.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import numpy as np
import torch

from trtspec.errors import ModelCallError, ModelTimeoutError, one_line
from trtspec.decoding.types import Proposal, SamplingParams


class BLSError(ModelCallError):
    """A call to the draft or target model failed (model down, unloaded, or it answered an error)."""


class BLSTimeout(BLSError, ModelTimeoutError):
    """A call to the draft or target model missed its deadline (it may still finish; its result is unused)."""


class StubDeadError(BLSError):
    """The model's Python stub is dead: Triton answers "Stub process '<m>_0_0' is not healthy."
    (it does not restart the stub; docs/reliability.md). No probe is needed to know it must be reloaded."""


_DEAD_STUB = re.compile(r"Stub process .* is not healthy")


class RemoteModel(Protocol):
    """A draft or target in its own Triton model, as ``spec_decode`` drives and supervises it:
    a :class:`~trtspec.decoding.protocols.LanguageModel` with a name and a probe."""

    model_name: str

    @property
    def vocab_size(self) -> int: ...

    @property
    def max_context(self) -> int: ...

    def new_session(self, session_id: str = "") -> Any: ...

    def probe(self) -> None:
        """One small real call through BLS; raises :class:`BLSError` when the model does not answer."""
        ...


class BLSModel:
    """A Triton model ``spec_decode`` calls through BLS: its name and what sequences it holds."""

    def __init__(self, pb: Any, model_name: str, vocab_size: int, max_context: int) -> None:
        self._pb = pb
        self.model_name = model_name
        self._vocab = vocab_size
        self._max_context = max_context

    @property
    def vocab_size(self) -> int:
        return self._vocab

    @property
    def max_context(self) -> int:
        return self._max_context


class BLSLanguageModel(BLSModel):
    """A Triton model speaking the draft/target protocol, called through BLS."""

    def __init__(
        self, pb: Any, model_name: str, vocab_size: int, max_context: int, cpu_share: Callable[[], int] | None = None
    ) -> None:
        super().__init__(pb, model_name, vocab_size, max_context)
        self._cpu_share = cpu_share  # each call's ``cpu_share`` input (None: not sent, the model's default 1)

    def new_session(self, session_id: str = "") -> BLSSession:
        # Client request ids may repeat or be empty; the session id must not.
        unique = f"{session_id}:{uuid.uuid4().hex[:16]}" if session_id else uuid.uuid4().hex
        return BLSSession(self, unique)

    def call(
        self, session_id: str, token_ids: Sequence[int], num_logits: int, release: bool = False, argmax: bool = False
    ) -> np.ndarray:
        """One BLS request; float32 logits ``[num_logits, vocab]``, or with ``argmax`` the
        int64 argmax of each row ``[num_logits]`` (the model computes it: ids cross, not rows)."""
        pb = self._pb
        inputs = self._inputs(session_id, token_ids, num_logits)
        if release:
            inputs.append(pb.Tensor("release", np.array([True], dtype=np.bool_)))
        if argmax:
            inputs.append(pb.Tensor("return_argmax", np.array([True], dtype=np.bool_)))
        name, shape = ("argmax_ids", (num_logits,)) if argmax else ("logits", (num_logits, self._vocab))
        (out,) = self._exec(inputs, [name])
        if out.shape != shape:
            raise BLSError(f"model '{self.model_name}' returned {name} of shape {tuple(out.shape)}, expected {shape}")
        return out

    def call_propose(
        self, session_id: str, token_ids: Sequence[int], k: int, sampling: SamplingParams, seed: int | None
    ) -> Proposal:
        """One BLS request that drafts ``k`` tokens after ``token_ids`` (see ``DraftProposer``)."""
        pb = self._pb
        inputs = self._inputs(session_id, token_ids, 0)
        inputs.append(pb.Tensor("num_draft", np.array([k], dtype=np.int32)))
        if not sampling.greedy:
            inputs += [
                pb.Tensor("temperature", np.array([sampling.temperature], dtype=np.float32)),
                pb.Tensor("top_k", np.array([sampling.top_k], dtype=np.int32)),
                pb.Tensor("top_p", np.array([sampling.top_p], dtype=np.float32)),
            ]
            if sampling.exact and sampling.seed is not None:  # the target's position-keyed draws
                inputs.append(pb.Tensor("exact_seed", np.array([sampling.seed], dtype=np.uint64)))
            elif seed is not None:
                inputs.append(pb.Tensor("seed", np.array([seed], dtype=np.int64)))
        if not sampling.penalties.neutral:
            penalties = sampling.penalties.inputs().items()
            inputs += [pb.Tensor(name, np.array([v], dtype=np.float32)) for name, v in penalties]
        if not sampling.logit_bias.neutral:
            bias = sampling.logit_bias
            inputs += [pb.Tensor("logit_bias_ids", np.array(bias.ids, dtype=np.int64)),
                       pb.Tensor("logit_bias_values", np.array(bias.values, dtype=np.float32))]
        ids, probs = self._exec(inputs, ["draft_ids", "draft_probs"])
        expected_q = (0 if sampling.greedy else k, self._vocab)
        if ids.shape != (k,) or probs.shape != expected_q:
            raise BLSError(
                f"model '{self.model_name}' proposed {tuple(ids.shape)} tokens with q {tuple(probs.shape)}, "
                f"expected ({k},) and {expected_q}"
            )
        q = torch.from_numpy(probs) if not sampling.greedy else None
        return Proposal(tokens=tuple(int(t) for t in ids), q=q)

    def _inputs(self, session_id: str, token_ids: Sequence[int], num_logits: int) -> list:
        pb = self._pb
        inputs = [
            pb.Tensor("session_id", np.array([session_id.encode()], dtype=np.object_)),
            pb.Tensor("token_ids", np.asarray(token_ids, dtype=np.int64).reshape(-1)),
            pb.Tensor("num_logits", np.array([num_logits], dtype=np.int32)),
        ]
        if self._cpu_share is not None:
            inputs.append(pb.Tensor("cpu_share", np.array([self._cpu_share()], dtype=np.int32)))
        return inputs

    def probe(self) -> None:
        """A real forward (two tokens, one row of logits), then the release: what the supervisor asks."""
        sid = f"__trtspec_probe__:{uuid.uuid4().hex[:12]}"
        self.call(sid, [1, 2], 1)
        self.call(sid, [], 0, release=True)

    def _exec(self, inputs: list, outputs: list[str]) -> list[np.ndarray]:
        return exec_bls(self._pb, self.model_name, inputs, outputs)


def exec_bls(pb: Any, model_name: str, inputs: list, outputs: list[str]) -> list[np.ndarray]:
    """One BLS request to ``model_name``; the named outputs as owned arrays, or :class:`BLSError`
    (:class:`StubDeadError` for a dead Python stub) with the model's one-line message."""
    request = pb.InferenceRequest(model_name=model_name, inputs=inputs, requested_output_names=outputs)
    try:
        response = request.exec()
    except Exception as e:  # the stub raises when the model is missing or not ready
        raise BLSError(f"model '{model_name}' is unavailable: {one_line(e)}") from e
    if response.has_error():
        message = one_line(response.error().message())
        error = StubDeadError if _DEAD_STUB.search(message) else BLSError
        raise error(f"model '{model_name}' failed: {message}")
    arrays = []
    for name in outputs:
        out = pb.get_output_tensor_by_name(response, name)
        if out is None:
            raise BLSError(f"model '{model_name}' returned no '{name}' output")
        arrays.append(np.array(out.as_numpy(), copy=True))  # own it: the response's memory is released
    return arrays


class RemoteSequence:
    """One sequence on a remote model, from the caller's side: the tokens the model is known to
    hold for it. Calls name the whole sequence; ``truncate`` only shortens the list (the model sees
    the rollback on the next call, as the common prefix of old and new)."""

    def __init__(self, model_name: str, max_context: int, session_id: str) -> None:
        self._model_name = model_name
        self._limit = max_context
        self.session_id = session_id
        self._tokens: list[int] = []
        self._closed = False

    @property
    def num_cached(self) -> int:
        return len(self._tokens)

    def _extend(self, token_ids: Sequence[int], extra: int = 0) -> list[int]:
        """The whole sequence after appending ``token_ids`` (at least one), checked to leave room for
        ``extra`` more tokens; the session is unchanged until the model has answered."""
        if self._closed:
            raise RuntimeError(f"session {self.session_id!r} is closed")
        if len(token_ids) == 0:
            raise ValueError("a call needs at least one new token")
        tokens = self._tokens + [int(t) for t in token_ids]
        if len(tokens) + extra > self._limit:
            raise ValueError(f"sequence would hold {len(tokens) + extra} tokens; context is {self._limit}")
        return tokens

    def truncate(self, length: int) -> None:
        if not 0 <= length <= len(self._tokens):
            raise ValueError(f"cannot truncate a sequence of {len(self._tokens)} tokens to {length}")
        del self._tokens[length:]


class BLSSession(RemoteSequence):
    """One sequence on a :class:`BLSLanguageModel`; see the module docstring."""

    def __init__(self, model: BLSLanguageModel, session_id: str) -> None:
        super().__init__(model.model_name, model.max_context, session_id)
        self._model = model

    def forward(self, token_ids: Sequence[int], num_logits: int) -> torch.Tensor:
        return torch.from_numpy(self._run(token_ids, num_logits, argmax=False))

    def forward_argmax(self, token_ids: Sequence[int], num_logits: int) -> list[int]:
        """``forward(...).argmax(-1)``, computed by the model (see ``ArgmaxForward``)."""
        return [int(t) for t in self._run(token_ids, num_logits, argmax=True)]

    def _run(self, token_ids: Sequence[int], num_logits: int, argmax: bool) -> np.ndarray:
        tokens = self._extend(token_ids)
        if not 0 <= num_logits <= len(token_ids):
            raise ValueError(f"num_logits must be in [0, {len(token_ids)}], got {num_logits}")
        out = self._model.call(self.session_id, tokens, num_logits, argmax=argmax)
        self._tokens = tokens  # only once the model holds them
        return out

    def propose(self, token_ids: Sequence[int], k: int, sampling: SamplingParams, seed: int | None,
                text: Sequence[int] = ()) -> Proposal:
        """Draft ``k`` tokens in ONE call (the draft model runs the drafting steps itself, and counts
        the penalties over the whole sequence it is sent: ``text`` is not needed)."""
        tokens = self._extend(token_ids, k - 1)
        proposal = self._model.call_propose(self.session_id, tokens, k, sampling, seed)
        self._tokens = tokens + list(proposal.tokens[: k - 1])  # what the model's cache now holds
        return proposal

    def close(self) -> None:
        """Tell the model to free the cache (best effort: LRU eviction frees it otherwise)."""
        if self._closed:
            return
        self._closed = True
        self._model.call(self.session_id, [], 0, release=True)
