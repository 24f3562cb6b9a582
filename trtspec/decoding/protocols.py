"""The contracts between the draft-verify loop and everything it drives.

The loop knows nothing of torch modules, Triton or HTTP: it talks to a model
through :class:`LanguageModel` / :class:`LMSession`, picks ``k`` through a
:class:`DraftLengthPolicy`, and turns ids into text through a
:class:`Detokenizer`. In-process runtimes, BLS-backed proxies inside Triton and
the replay fakes of the tests all implement the same three small protocols.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, TypeGuard, TypeVar, runtime_checkable

import torch

from trtspec.decoding.types import IterationOutcome, Proposal, SamplingParams

C = TypeVar("C")


@runtime_checkable
class LMSession(Protocol):
    """One sequence's view of a model: its KV cache and the calls that move it.

    Invariant: the cache holds exactly the first ``num_cached`` tokens of the
    sequence the loop has fed it; ``forward`` appends, ``truncate`` rolls back.
    """

    @property
    def num_cached(self) -> int:
        """Tokens currently held in the KV cache."""
        ...

    def forward(self, token_ids: Sequence[int], num_logits: int) -> torch.Tensor:
        """Append ``token_ids`` to the cache in ONE forward pass.

        Returns float32 logits ``[num_logits, vocab]`` for the last
        ``num_logits`` of the appended positions (row ``i`` predicts the token
        after position ``len(token_ids) - num_logits + i``). ``num_logits`` may be 0.
        """
        ...

    def truncate(self, length: int) -> None:
        """Drop cached tokens beyond ``length``; afterwards ``num_cached == length``.

        The next ``forward`` must give the logits a fresh prefill of the same
        tokens would (within float tolerance).
        """
        ...

    def close(self) -> None:
        """Free the cache. The session must not be used afterwards."""
        ...


@runtime_checkable
class DraftProposer(Protocol):
    """Optional capability of a draft :class:`LMSession`: propose ``k`` tokens in ONE call.

    A session without it is driven one ``forward`` per draft token
    (:func:`trtspec.decoding.drafting.propose_locally`). A remote draft implements
    it to save ``k - 1`` round trips; it must give the same proposal the local
    procedure would (greedy: token for token; sampling: the same distribution,
    drawn from a generator seeded with ``seed``, or in exact mode with the
    request's seed the same position-keyed draws), and leave its cache holding
    ``token_ids`` (appended) plus the first ``m - 1`` of the ``m`` proposed tokens.
    ``m`` is ``k``, or less (at least 1) when the draft stopped early (an engine that
    ended the sequence); ``q`` then has ``m`` rows. The loop checks the ``m`` it got.
    ``text`` is the whole sequence ``token_ids`` ends, which the penalties count
    (a session that holds the sequence itself may ignore it).
    """

    def propose(self, token_ids: Sequence[int], k: int, sampling: SamplingParams, seed: int | None,
                text: Sequence[int] = ()) -> Proposal:
        ...


@runtime_checkable
class ArgmaxForward(Protocol):
    """Optional capability of a target :class:`LMSession`: ``forward`` answering only the argmax.

    Greedy verification needs the target's argmax at each of the ``k + 1``
    positions, not ``k + 1`` rows of vocabulary logits; a remote target sends
    ``k + 1`` ids instead (demo pair: 4 bytes instead of 196 KB a row). Answers
    ``forward(token_ids, num_logits).argmax(-1)`` (ties: the lowest id), with the
    same effect on the cache; a runtime may compute the logits its own way for it
    (a float32 lean model's ``ArgmaxHead``: equal to ``forward``'s to their last
    bits, not bit for bit), the same way in every pass.
    """

    def forward_argmax(self, token_ids: Sequence[int], num_logits: int) -> list[int]:
        ...


def has_capability(session: object, capability: type[C]) -> TypeGuard[C]:
    """Whether ``session`` offers an optional capability (:class:`DraftProposer`, :class:`ArgmaxForward`,
    :class:`DraftVerifier`), decided by its class: ``isinstance`` against a runtime-checkable protocol
    looks up every member on every call (4-9 us in Python 3.11, several times an iteration), the class's
    answer is cached (0.1 us). Sessions define their capabilities as methods of their class."""
    return issubclass(type(session), capability)


def argmax_ids(session: LMSession, token_ids: Sequence[int], num_logits: int) -> list[int]:
    """The argmax of the last ``num_logits`` positions' logits after appending ``token_ids``: the
    session's ``forward_argmax`` where it has one (only ids travel), else ``forward`` and argmax here."""
    if has_capability(session, ArgmaxForward):
        return session.forward_argmax(token_ids, num_logits)
    return session.forward(token_ids, num_logits).argmax(dim=-1).tolist()


@runtime_checkable
class DraftVerifier(Protocol):
    """Optional capability of a target :class:`LMSession`: accept or reject drafts itself.

    For targets that decide acceptance in the engine (a TensorRT-LLM engine built
    for external draft tokens answers the accepted drafts plus one token; it
    sends no logits). ``verify`` appends ``token_ids`` (committed tokens the
    cache lacks, at least one) and checks ``drafted`` (possibly empty) after
    them in ONE call, returning ``(n_accepted, next_token)``:

    - greedy: exactly :func:`~trtspec.decoding.acceptance.greedy_accept` on the
      target's argmax at the ``k + 1`` positions;
    - sampling: every emitted token distributed as the target alone would draw
      it (token matching or rejection sampling), using randomness from ``seed``.

    Afterwards the cache holds ``token_ids`` plus the accepted drafts.
    """

    def verify(
        self, token_ids: Sequence[int], drafted: Sequence[int], sampling: SamplingParams, seed: int | None
    ) -> tuple[int, int]:
        ...


@runtime_checkable
class Drafter(Protocol):
    """Proposes tokens to follow one request's committed tokens (a draft model, n-gram, suffix).

    The loop asks for ``k`` tokens and verifies what comes back; it never reaches
    into the drafter. Contract:

    - ``propose`` returns up to ``k`` tokens (fewer, or none, when it has nothing
      better to offer); ``tokens`` is the whole committed sequence (prompt and
      output), which only grows between calls of one request.
    - Sampling needs the draft probabilities ``q`` (``[m, vocab]``) the tokens were
      drawn from; a drafter that picks tokens deterministically sends rows with
      probability 1 on its token, which keeps rejection sampling exact. Greedy: ``q``
      is ``None``.
    - ``rollback(length)``: only the first ``length`` tokens of the sequence (committed
      tokens and the accepted drafts) are valid; drop state built on anything after.
    - ``close`` frees what the drafter holds; it must not be used afterwards.
    """

    @property
    def name(self) -> str:
        """The drafter's kind as users name it (``model``, ``ngram``, ``suffix``)."""
        ...

    def propose(
        self, tokens: Sequence[int], k: int, sampling: SamplingParams, generator: torch.Generator | None
    ) -> Proposal:
        ...

    def rollback(self, length: int) -> None:
        ...

    def close(self) -> None:
        ...


@runtime_checkable
class LanguageModel(Protocol):
    """A model the loop can open sequences on."""

    @property
    def vocab_size(self) -> int:
        """Rows of the logits ``forward`` returns."""
        ...

    @property
    def max_context(self) -> int:
        """Most tokens one sequence may hold."""
        ...

    def new_session(self, session_id: str = "") -> LMSession:
        ...


@runtime_checkable
class DraftLengthPolicy(Protocol):
    """Chooses ``k`` (tokens to draft) before each iteration; learns from its outcome.

    ``k == 0`` means a plain target step for that iteration.
    """

    def next_k(self) -> int:
        ...

    def observe(self, outcome: IterationOutcome) -> None:
        ...


@runtime_checkable
class DrafterChoice(Protocol):
    """Optional capability of a :class:`DraftLengthPolicy`: which drafter drafts next.

    Asked before each ``next_k`` of a request that has a drafter open;
    ``names`` are those still open, in the order the request lists them
    (several for ``auto``). A policy without it gets the first.
    """

    def next_drafter(self, names: Sequence[str]) -> str:
        ...


@runtime_checkable
class Detokenizer(Protocol):
    def decode(self, token_ids: Sequence[int]) -> str:
        """Text of ``token_ids``, special tokens skipped."""
        ...


def choose_drafter(policy: DraftLengthPolicy, names: Sequence[str]) -> str:
    """``policy``'s choice among ``names`` when it is a :class:`DrafterChoice`, else the first."""
    return policy.next_drafter(names) if isinstance(policy, DrafterChoice) else names[0]
