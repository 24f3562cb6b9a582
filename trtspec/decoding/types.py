"""Value types of the draft-verify loop.

Vocabulary (used the same way in code, metric names and docs):

- **drafter**: what proposes tokens: the draft ``model``, or a free lookup in the
  text (``ngram``, ``suffix``); ``auto`` lets the policy choose per iteration.
- **drafted** tokens: proposed by the drafter, ``k`` per iteration.
- **accepted** tokens: drafted tokens the target's verification kept (a prefix
  of the draft, ``0 <= accepted <= k``).
- **rejected** tokens: ``drafted - accepted`` (the first rejected position and
  every draft token after it).
- **bonus** token: the extra token sampled from the target when all ``k`` drafts
  were accepted (the verify pass yields ``k + 1`` distributions).
- **correction** token: the token drawn from the target (greedy: its argmax;
  sampling: the residual distribution) at the first rejected position.
- **emitted** tokens: tokens appended to the output. Every iteration emits
  ``accepted + 1`` (the +1 is the bonus or correction token), fewer only when a
  stop condition cuts the iteration short.
- **acceptance length**: emitted tokens per iteration, bonus/correction
  INCLUDED (so plain target decoding has acceptance length 1).
- **acceptance rate**: ``accepted / drafted``; **rejection rate** is
  ``1 - acceptance rate`` over the same tokens.
"""

from __future__ import annotations

import dataclasses
import enum
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from trtspec.errors import InvalidRequestError

MAX_TOP_LOGPROBS = 20  # OpenAI's limit
# The most likely tokens at one position and their log-probabilities, best first: ((id, logprob), ...).
# Fewer than asked where fewer could be chosen (sampling: outside top-k/top-p the probability is 0).
TopLogprobs = tuple[tuple[int, float], ...]


@dataclass(frozen=True)
class Penalties:
    """TensorRT-LLM's repetition, presence and frequency penalties (its ``batchApplyPenalty``): an id that
    occurs in the text so far, the prompt included, has its logit divided by ``repetition`` (multiplied
    when negative), less ``presence``, less ``frequency`` times its count. They act after the
    temperature, as there: sampling penalises ``logits / temperature``; greedy, the logits as they are
    (TensorRT-LLM decodes greedily at its default temperature, 1)."""

    repetition: float = 1.0
    presence: float = 0.0
    frequency: float = 0.0

    @property
    def neutral(self) -> bool:
        return self == Penalties()

    def inputs(self) -> dict[str, float]:
        """The penalties under their input names (TensorRT-LLM's, on every interface of ours)."""
        return {"repetition_penalty": self.repetition, "presence_penalty": self.presence,
                "frequency_penalty": self.frequency}

    @classmethod
    def from_inputs(cls, value: Callable[[str], Any]) -> Penalties:
        """From the inputs ``value(name)`` (None: not sent, the neutral value)."""
        neutral = cls().inputs()
        return cls(*(neutral[name] if (v := value(name)) is None else float(v) for name in neutral))

    def validate(self) -> None:
        for name, v in self.inputs().items():
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise InvalidRequestError(f"{name} must be a finite number, got {v!r}")
        if self.repetition <= 0:
            raise InvalidRequestError(f"repetition_penalty must be > 0, got {self.repetition}")

    def apply(self, logits: torch.Tensor, counts: torch.Tensor, temperature: float) -> torch.Tensor:
        """``logits`` [n, vocab] (float32) penalised by ``counts`` [n, vocab], each id's occurrences in
        its row's text; presence and frequency scaled by ``temperature`` (0: greedy, 1), so that the
        result divided by it is TensorRT-LLM's."""
        scale = temperature or 1.0
        seen = counts > 0
        x = torch.where(seen, torch.where(logits < 0, logits * self.repetition, logits / self.repetition), logits)
        return x - seen * (self.presence * scale) - counts * (self.frequency * scale)


@dataclass(frozen=True)
class LogitBias:
    """Values added to some ids' logits (TensorRT-LLM's embedding bias, OpenAI's and vLLM's ``logit_bias``),
    before anything else: before the temperature and the penalties, where TensorRT-LLM's ``batchApplyPenalty``
    adds it. One value per id (:meth:`of` sums repeats), ids ascending."""

    ids: tuple[int, ...] = ()
    values: tuple[float, ...] = ()  # [len(ids)]

    @classmethod
    def of(cls, pairs: Iterable[tuple[int, float]]) -> LogitBias:
        total: dict[int, float] = {}
        for token, value in pairs:
            total[int(token)] = total.get(int(token), 0.0) + float(value)
        return cls(tuple(sorted(total)), tuple(total[t] for t in sorted(total)))

    @property
    def neutral(self) -> bool:
        return not self.ids

    def validate(self, vocab_size: int | None = None) -> None:
        if len(self.ids) != len(self.values):
            raise InvalidRequestError(f"logit bias: {len(self.ids)} token ids and {len(self.values)} values; "
                                      "one value per id")
        bad = next((t for t in self.ids if not 0 <= t < (vocab_size or 2**63)), None)
        if bad is not None:
            raise InvalidRequestError(f"logit bias: token id {bad} is not in the vocabulary"
                                      + (f" (0..{vocab_size - 1})" if vocab_size else ""))
        if not all(math.isfinite(v) for v in self.values):
            raise InvalidRequestError(f"logit bias values must be finite, got {list(self.values)}")

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        """``logits`` [n, vocab] with the values added to their ids in every row (in place; an id given twice
        gets both)."""
        if self.ids:
            ids = torch.tensor(self.ids, dtype=torch.int64, device=logits.device)
            values = torch.tensor(self.values, dtype=logits.dtype, device=logits.device)
            logits.index_add_(1, ids, values.expand(logits.shape[0], -1))
        return logits


@dataclass(frozen=True)
class SamplingParams:
    """How the next token is chosen. ``temperature == 0`` means greedy."""

    temperature: float = 0.0
    top_k: int = 0  # 0: no top-k filter
    top_p: float = 1.0  # 1.0: no nucleus filter
    seed: int | None = None
    # Exact mode: sampled tokens are position-keyed draws accepted by token matching
    # (acceptance.match_draws), so a seed gives the same output with speculation on or off.
    exact: bool = False
    penalties: Penalties = Penalties()  # the target's, and a model draft's (its drafts then agree more often)
    logit_bias: LogitBias = LogitBias()  # the same: the target's and a model draft's

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def validate(self) -> None:
        if not isinstance(self.temperature, (int, float)) or not math.isfinite(self.temperature):
            raise InvalidRequestError(f"temperature must be a finite number >= 0, got {self.temperature!r}")
        if self.temperature < 0:
            raise InvalidRequestError(f"temperature must be >= 0, got {self.temperature}")
        if not isinstance(self.top_k, int) or self.top_k < 0:
            raise InvalidRequestError(f"top_k must be an integer >= 0 (0 disables it), got {self.top_k!r}")
        if not isinstance(self.top_p, (int, float)) or not (0.0 < self.top_p <= 1.0):
            raise InvalidRequestError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if self.seed is not None and (not isinstance(self.seed, int) or self.seed < 0):
            raise InvalidRequestError(f"seed must be a non-negative integer, got {self.seed!r}")
        if not isinstance(self.exact, bool):
            raise InvalidRequestError(f"exact must be true or false, got {self.exact!r}")
        self.penalties.validate()
        self.logit_bias.validate()


@dataclass(frozen=True)
class StopCriteria:
    """When generation ends. Nothing past a stop is ever emitted."""

    max_new_tokens: int
    eos_token_ids: frozenset[int] = frozenset()
    stop_token_ids: frozenset[int] = frozenset()
    stop_strings: tuple[str, ...] = ()
    # The first this many tokens are never an EOS or stop token id: the target chooses among the others
    # (vLLM's min_tokens, TensorRT-LLM's min_length, transformers' min_new_tokens). Stop strings still stop.
    min_new_tokens: int = 0

    def validate(self) -> None:
        if not isinstance(self.max_new_tokens, int) or isinstance(self.max_new_tokens, bool):
            raise InvalidRequestError(f"max_tokens must be an integer, got {self.max_new_tokens!r}")
        if self.max_new_tokens <= 0:
            raise InvalidRequestError(f"max_tokens must be > 0, got {self.max_new_tokens}")
        if any(not s for s in self.stop_strings):
            raise InvalidRequestError("stop strings must be non-empty")
        if not 0 <= self.min_new_tokens <= self.max_new_tokens:
            raise InvalidRequestError(f"min_tokens must be >= 0 and <= max_tokens ({self.max_new_tokens}), "
                                      f"got {self.min_new_tokens}")


@dataclass(frozen=True)
class LogitRules:
    """What a request does to each row of a target pass before anything is chosen: its logit ``bias``;
    ``banned[j]``, the ids row ``j`` may not choose (none past the tuple: ``min_tokens``, ``bad_words``);
    and ``penalties`` over row ``j``'s text, ``context`` and then ``drafted[:j]``."""

    banned: tuple[frozenset[int], ...] = ()
    penalties: Penalties = Penalties()
    context: tuple[int, ...] = ()  # the committed tokens, prompt included (kept only for penalties)
    drafted: tuple[int, ...] = ()
    bias: LogitBias = LogitBias()  # added first, in every row

    def apply(self, logits: torch.Tensor, temperature: float) -> torch.Tensor:
        """``logits`` [n, vocab] as float32 with the bias added, then the penalties applied
        (``temperature``: see :meth:`Penalties.apply`), and each row's banned ids at -inf (a copy)."""
        n, vocab = logits.shape
        out = self.bias.apply(logits.float().clone())
        if not self.penalties.neutral:
            out = self.penalties.apply(out, self._counts(n, vocab, logits.device), temperature)
        for j, ids in enumerate(self.banned[:n]):
            if ids:
                out[j, sorted(i for i in ids if i < vocab)] = float("-inf")
        return out

    def _counts(self, n: int, vocab: int, device: torch.device) -> torch.Tensor:
        """[n, vocab]: each id's occurrences in row ``j``'s text."""
        base = torch.bincount(torch.tensor(self.context, dtype=torch.int64, device=device), minlength=vocab)
        counts = base[:vocab].repeat(n, 1)
        for j, tok in enumerate(self.drafted[: n - 1]):
            if 0 <= tok < vocab:
                counts[j + 1 :, tok] += 1
        return counts.float()


class DrafterKind(str, enum.Enum):
    """What drafts for a request (see :mod:`trtspec.decoding.drafting`)."""

    MODEL = "model"  # the draft model
    NGRAM = "ngram"  # prompt lookup in the request's text: no model call
    SUFFIX = "suffix"  # suffix decoding over the request's text and recent outputs: no model call
    AUTO = "auto"  # per iteration, the policy chooses among a free drafter, the model and none

    @property
    def free(self) -> bool:
        """A lookup in the text, no model call: a wrong draft costs only its rows in the target's pass."""
        return self in (DrafterKind.NGRAM, DrafterKind.SUFFIX)


@dataclass(frozen=True)
class GenerationRequest:
    """One request to the loop. Never mutated; derive variants with ``dataclasses.replace``."""

    prompt_ids: tuple[int, ...]
    stop: StopCriteria
    sampling: SamplingParams = SamplingParams()
    request_id: str = ""
    drafter: DrafterKind = DrafterKind.MODEL
    # Token sequences the text never contains (TensorRT-LLM's bad_words): after the rest of one, its last
    # token is never chosen (a one-token word: never). Prompt included, as transformers' bad_words_ids.
    bad_words: tuple[tuple[int, ...], ...] = ()
    # Report each emitted token's log-probability (TensorRT-LLM's return_log_probs): in the distribution
    # the target chose it from (greedy: its logits after the rules above; sampling: after temperature,
    # top-k and top-p), the same with speculation on or off.
    logprobs: bool = False
    # With logprobs: at each position also the top_logprobs most likely tokens of that distribution and
    # theirs, best first (OpenAI's top_logprobs; 0..MAX_TOP_LOGPROBS).
    top_logprobs: int = 0

    def validate(self, vocab_size: int | None = None) -> None:
        if len(self.prompt_ids) == 0:
            raise InvalidRequestError("prompt is empty: at least one token is needed")
        if any(not word for word in self.bad_words):
            raise InvalidRequestError("a bad word must hold at least one token")
        if not (isinstance(self.top_logprobs, int) and 0 <= self.top_logprobs <= MAX_TOP_LOGPROBS):
            raise InvalidRequestError(f"top_logprobs must be an integer in [0, {MAX_TOP_LOGPROBS}], got {self.top_logprobs!r}")
        if self.top_logprobs and not self.logprobs:
            raise InvalidRequestError("top_logprobs needs logprobs (return_log_probs) on")
        self.sampling.logit_bias.validate(vocab_size)
        if vocab_size is not None:
            bad = [t for t in self.prompt_ids if not (0 <= t < vocab_size)]
            if bad:
                raise InvalidRequestError(f"prompt has token ids outside [0, {vocab_size}): {bad[:5]}")
        self.stop.validate()
        self.sampling.validate()

    def rules(self, context: Sequence[int], emitted: int, drafted: Sequence[int]) -> LogitRules | None:
        """What the request does to each row of a target pass after ``context`` (the committed tokens,
        ``emitted`` of them output) and ``drafted``: EOS and stop ids banned while fewer than
        ``min_new_tokens`` are out, a bad word's last token after the rest of it, the penalties, the logit
        bias. None: nothing (the usual case)."""
        banned, penalties, bias = self._banned(context, emitted, drafted), self.sampling.penalties, \
            self.sampling.logit_bias
        if penalties.neutral:  # no counts needed
            return None if banned is None and bias.neutral else LogitRules(banned or (), bias=bias)
        return LogitRules(banned or (), penalties, tuple(context), tuple(drafted), bias)

    def _banned(self, context: Sequence[int], emitted: int, drafted: Sequence[int]) -> tuple[frozenset[int], ...] | None:
        """Per row, the ids it may not choose (None: none in any row)."""
        if not self.bad_words and emitted >= self.stop.min_new_tokens:
            return None
        held = self.stop.eos_token_ids | self.stop.stop_token_ids
        rows = []
        for j in range(len(drafted) + 1):
            ids = set(held) if emitted + j < self.stop.min_new_tokens else set()
            for word in self.bad_words:
                n = len(word) - 1  # the tokens before the banned one
                if n == 0 or (list(context[-n:]) + list(drafted[:j]))[-n:] == list(word[:-1]):
                    ids.add(word[-1])
            rows.append(frozenset(ids))
        return tuple(rows) if any(rows) else None

    @classmethod
    def make_dummy(cls, prompt_len: int = 8, max_new_tokens: int = 8) -> GenerationRequest:
        """A small valid request, for tests and warm-up."""
        return cls(prompt_ids=tuple(range(1, prompt_len + 1)), stop=StopCriteria(max_new_tokens=max_new_tokens))


class FinishReason(str, enum.Enum):
    LENGTH = "length"  # max new tokens reached
    STOP = "stop"  # EOS, a stop token id or a stop string
    CONTEXT = "context"  # the model's context window is full
    CANCELLED = "cancelled"  # the caller cancelled


@dataclass(frozen=True)
class IterationOutcome:
    """What one draft-verify iteration did; what k-policies learn from."""

    k: int  # tokens drafted this iteration (0: plain target step)
    accepted: int  # drafted tokens kept by verification
    emitted: int  # tokens appended to the output (after stop truncation)
    bonus: bool  # all k accepted and the bonus token was drawn
    context_len: int  # tokens in the sequence before this iteration
    draft_time_s: float
    verify_time_s: float
    # The tokens behind the outcome (for rejection traces): the k drafted tokens, and the
    # target's token at each drafted position given the drafts before it. Greedy: its argmax
    # at all k positions. Sampling: the accepted drafts, then the correction token at the
    # first rejected position (accepted + 1 tokens; all k drafts when all were accepted).
    drafted: tuple[int, ...] = ()
    target_tokens: tuple[int, ...] = ()
    # The draft raised this iteration; the request goes on with the target alone
    # (k is then 0 here and in every later iteration of the request).
    draft_failed: bool = False
    drafter: str = ""  # the drafter's name ("" when none drafted: k == 0 by choice)

    @property
    def free_drafted(self) -> bool:
        """Drafted by a free drafter (``ngram``, ``suffix``): the breaker and the fallback, which
        guard the draft model, neither count nor act on it."""
        return bool(self.drafter) and DrafterKind(self.drafter).free

    @property
    def tested(self) -> int:
        return tested_positions(self.k, self.accepted)


def tested_positions(k: int, accepted: int) -> int:
    """Draft positions verification tested of ``k`` drafted, ``accepted`` kept: the accepted ones
    and the first rejected one (the positions after a rejection are never tested). A draft whose
    every position is accepted with probability ``a`` has ``1 - accepted / tested`` near ``1 - a``
    at any ``k``."""
    return min(k, accepted + 1)


class AcceptanceRatios:
    """The two ratios every count of speculation reports, defined once (see the module docstring for
    the vocabulary); a class with these four counts gets them."""

    iterations: int
    drafted_tokens: int
    accepted_tokens: int
    emitted_tokens: int

    @property
    def acceptance_rate(self) -> float | None:
        """accepted / drafted; None when nothing was drafted."""
        return self.accepted_tokens / self.drafted_tokens if self.drafted_tokens else None

    @property
    def mean_acceptance_length(self) -> float | None:
        """Emitted tokens per iteration (bonus/correction token included)."""
        return self.emitted_tokens / self.iterations if self.iterations else None


@dataclass
class SpecStats(AcceptanceRatios):
    """Per-request counters. See the module docstring for the vocabulary."""

    iterations: int = 0
    drafted_tokens: int = 0
    accepted_tokens: int = 0
    bonus_tokens: int = 0
    emitted_tokens: int = 0
    prompt_tokens: int = 0
    draft_errors: int = 0  # draft calls that failed; the request went on without the draft
    # accepted_per_position[i]: iterations whose draft token i (0-based) was
    # accepted. Position i can only be accepted if positions < i were.
    accepted_per_position: list[int] = field(default_factory=list)
    # drafted_per_position[i]: iterations that drafted at least i + 1 tokens.
    drafted_per_position: list[int] = field(default_factory=list)
    # Per drafter name: tokens it drafted and tokens of those accepted.
    drafted_by: dict[str, int] = field(default_factory=dict)
    accepted_by: dict[str, int] = field(default_factory=dict)
    draft_time_s: float = 0.0
    verify_time_s: float = 0.0
    time_to_first_token_s: float | None = None
    total_time_s: float = 0.0

    def observe(self, o: IterationOutcome) -> None:
        self.iterations += 1
        self.drafted_tokens += o.k
        self.accepted_tokens += o.accepted
        self.bonus_tokens += int(o.bonus)
        self.emitted_tokens += o.emitted
        self.draft_time_s += o.draft_time_s
        self.verify_time_s += o.verify_time_s
        if o.k:
            self.drafted_by[o.drafter] = self.drafted_by.get(o.drafter, 0) + o.k
            self.accepted_by[o.drafter] = self.accepted_by.get(o.drafter, 0) + o.accepted
        if o.k > len(self.drafted_per_position):
            grow = o.k - len(self.drafted_per_position)
            self.drafted_per_position.extend([0] * grow)
            self.accepted_per_position.extend([0] * grow)
        for i in range(o.k):
            self.drafted_per_position[i] += 1
        for i in range(o.accepted):
            self.accepted_per_position[i] += 1

    def merge(self, other: SpecStats) -> None:
        """Add ``other``'s counts and times into this one (aggregate over requests)."""
        for f in ("iterations", "drafted_tokens", "accepted_tokens", "bonus_tokens", "emitted_tokens",
                  "prompt_tokens", "draft_errors", "draft_time_s", "verify_time_s", "total_time_s"):
            setattr(self, f, getattr(self, f) + getattr(other, f))
        for mine, theirs in ((self.accepted_per_position, other.accepted_per_position),
                             (self.drafted_per_position, other.drafted_per_position)):
            mine.extend([0] * (len(theirs) - len(mine)))
            for i, n in enumerate(theirs):
                mine[i] += n
        for mine_by, theirs_by in ((self.drafted_by, other.drafted_by), (self.accepted_by, other.accepted_by)):
            for name, n in theirs_by.items():
                mine_by[name] = mine_by.get(name, 0) + n

    @property
    def rejected_tokens(self) -> int:
        return self.drafted_tokens - self.accepted_tokens

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["rejected_tokens"] = self.rejected_tokens
        d["acceptance_rate"] = self.acceptance_rate
        d["mean_acceptance_length"] = self.mean_acceptance_length
        return d


@dataclass(frozen=True)
class Proposal:
    """What the draft proposed in one iteration."""

    tokens: tuple[int, ...]  # [k] x_1..x_k
    q: torch.Tensor | None  # [k, vocab] the warped draft distributions (sampling); None when greedy


@dataclass(frozen=True)
class StreamChunk:
    """New output produced by one iteration (may be empty text while a stop string is pending)."""

    token_ids: tuple[int, ...]
    text: str
    logprobs: tuple[float, ...] = ()  # [len(token_ids)] when the request asked for them
    top_logprobs: tuple[TopLogprobs, ...] = ()  # [len(token_ids)] when the request asked for them


@dataclass
class GenerationResult:
    token_ids: list[int]  # new tokens only, the stopping token included
    text: str  # decoded new tokens, stop string and special tokens excluded
    finish_reason: FinishReason
    stats: SpecStats
    logprobs: list[float] | None = None  # [len(token_ids)]; None unless the request asked for them
    top_logprobs: list[TopLogprobs] | None = None  # [len(token_ids)]; None unless the request asked for them

    def to_dict(self) -> dict:
        out = {
            "text": self.text,
            "token_ids": list(self.token_ids),
            "finish_reason": self.finish_reason.value,
            "stats": self.stats.to_dict(),
        }
        if self.logprobs is not None:
            out["logprobs"] = list(self.logprobs)
        if self.top_logprobs is not None:
            out["top_logprobs"] = [[list(pair) for pair in top] for top in self.top_logprobs]
        return out


def as_token_tuple(ids: Sequence[int]) -> tuple[int, ...]:
    return tuple(int(t) for t in ids)
