"""What ``trtspec bench`` sends: prompts, output lengths, the A/B arms, and when.

- Prompts: the built-in set (:func:`trtspec.data.benchmark_prompts`) or a JSONL
  file, one object per line: ``{"prompt": "...", "max_tokens": 64, "priority": "normal"}``
  (``text_input`` is accepted for ``prompt``; ``max_tokens`` and ``priority``
  are optional). Bad lines are reported with their line numbers.
- Output lengths: ``--max-tokens 64`` (every request) or ``32-128`` (uniform,
  seeded); a prompt file's own ``max_tokens`` wins.
- Arms: ``--ab auto,off`` (equal shares) or ``auto:3,off:1`` (weights). Arms
  are interleaved by smooth weighted round-robin, so after ``n`` requests every
  arm has its share within one request; prompts are drawn with a seeded RNG
  independently of the arm, so no arm gets a biased subset of prompts.
- Drafter: ``--drafter model|ngram|suffix|auto`` is sent by the speculating
  arms' requests (``auto``, ``on``); the ``off`` arm sends none. Without it no
  request names one: the server's ``default_drafter`` drafts.
- Arrivals: open loop, Poisson at ``rate`` requests/s (exponential gaps,
  seeded), or closed loop (no schedule: the next request leaves when a worker
  is free).
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trtspec.errors import TrtspecError
from trtspec.wire import Priority, Speculation

ARMS = ("auto", "on", "off")  # the values of the ``speculation`` input


class BenchError(TrtspecError):
    """A bench option, prompt file or results file is unusable."""


class WorkloadError(BenchError):
    """A bench workload option or prompt file is malformed."""


@dataclass(frozen=True)
class Prompt:
    text: str
    max_tokens: int | None = None  # None: the run's output-length setting
    priority: str | None = None  # high | normal | low


@dataclass(frozen=True)
class RequestSpec:
    """One request of the run, fixed before it is sent."""

    index: int
    prompt: str
    max_tokens: int
    arm: str  # auto | on | off
    priority: str | None = None  # high | normal | low
    drafter: str | None = None  # model | ngram | suffix | auto; None: the server's default_drafter

    @property
    def request_id(self) -> str:
        return f"bench-{self.index}"


@dataclass(frozen=True)
class ArmSplit:
    """The A/B arms and their weights, e.g. ``auto,off`` or ``auto:3,off:1``."""

    arms: tuple[str, ...]
    weights: tuple[float, ...]

    @classmethod
    def parse(cls, text: str) -> ArmSplit:
        arms: list[str] = []
        weights: list[float] = []
        for part in (p.strip() for p in text.split(",")):
            if not part:
                continue
            name, _, w = part.partition(":")
            name = name.strip().lower()
            if name not in ARMS:
                raise WorkloadError(f"--ab: arm must be one of {', '.join(ARMS)}; got {name!r}")
            if name in arms:
                raise WorkloadError(f"--ab: arm {name!r} given twice")
            try:
                weight = float(w) if w else 1.0
            except ValueError:
                raise WorkloadError(f"--ab: weight of {name!r} must be a number, got {w!r}") from None
            if not weight > 0:
                raise WorkloadError(f"--ab: weight of {name!r} must be > 0, got {w!r}")
            arms.append(name)
            weights.append(weight)
        if not arms:
            raise WorkloadError("--ab: name at least one arm (auto, on, off)")
        return cls(tuple(arms), tuple(weights))

    def shares(self) -> dict[str, float]:
        total = sum(self.weights)
        return {a: w / total for a, w in zip(self.arms, self.weights, strict=True)}

    def sequence(self) -> Iterator[str]:
        """Smooth weighted round-robin (nginx's): exact shares, evenly interleaved."""
        current = [0.0] * len(self.arms)
        total = sum(self.weights)
        while True:
            for i, w in enumerate(self.weights):
                current[i] += w
            best = max(range(len(self.arms)), key=lambda i: current[i])
            current[best] -= total
            yield self.arms[best]

    def __str__(self) -> str:
        return ",".join(f"{a}:{w:g}" for a, w in zip(self.arms, self.weights, strict=True))


@dataclass(frozen=True)
class OutputLength:
    """``max_tokens`` per request: fixed, or uniform in ``[lo, hi]``."""

    lo: int
    hi: int

    @classmethod
    def parse(cls, text: str | int) -> OutputLength:
        s = str(text).strip()
        lo_s, sep, hi_s = s.partition("-")
        try:
            lo = int(lo_s)
            hi = int(hi_s) if sep else lo
        except ValueError:
            raise WorkloadError(f"--max-tokens must be N or LO-HI, got {s!r}") from None
        if lo < 1 or hi < lo:
            raise WorkloadError(f"--max-tokens must be >= 1 (and LO <= HI), got {s!r}")
        return cls(lo, hi)

    def draw(self, rng: random.Random) -> int:
        return self.lo if self.lo == self.hi else rng.randint(self.lo, self.hi)

    def __str__(self) -> str:
        return str(self.lo) if self.lo == self.hi else f"{self.lo}-{self.hi}"


def builtin_prompts() -> list[Prompt]:
    from trtspec.data import benchmark_prompts

    return [Prompt(p) for p in benchmark_prompts()]


def load_prompts(path: str | Path) -> list[Prompt]:
    """Prompts from a JSONL file; every bad line is reported (line numbers, 1-based), none skipped."""
    p = Path(path)
    try:
        lines = p.read_text(encoding="utf-8").splitlines()
    except OSError as e:
        raise WorkloadError(f"cannot read prompts file {p}: {e.strerror or e}") from None
    prompts: list[Prompt] = []
    problems: list[str] = []
    for n, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            problems.append(f"line {n}: not valid JSON ({e.msg})")
            continue
        if not isinstance(obj, dict):
            problems.append(f"line {n}: expected a JSON object")
            continue
        text = obj.get("prompt", obj.get("text_input"))
        if not isinstance(text, str) or not text:
            problems.append(f"line {n}: 'prompt' must be a non-empty string")
            continue
        mt = obj.get("max_tokens")
        if mt is not None and (not isinstance(mt, int) or isinstance(mt, bool) or mt < 1):
            problems.append(f"line {n}: 'max_tokens' must be an integer >= 1, got {mt!r}")
            continue
        pr = obj.get("priority")
        if pr is not None and pr not in {p.value for p in Priority}:
            problems.append(f"line {n}: 'priority' must be one of {', '.join(Priority)}, got {pr!r}")
            continue
        prompts.append(Prompt(text, mt, pr))
    if problems:
        shown = "; ".join(problems[:5]) + (f"; ... ({len(problems)} bad lines)" if len(problems) > 5 else "")
        raise WorkloadError(f"{p}: {shown}")
    if not prompts:
        raise WorkloadError(f"{p}: no prompts")
    return prompts


@dataclass
class Workload:
    """The sequence of requests of one run (deterministic for a seed)."""

    prompts: Sequence[Prompt]
    output: OutputLength
    split: ArmSplit
    seed: int = 0
    drafter: str | None = None  # sent by the speculating arms; None: the server's default_drafter

    def __post_init__(self) -> None:
        if not self.prompts:
            raise WorkloadError("no prompts")

    def requests(self) -> Iterator[RequestSpec]:
        rng = random.Random(self.seed)
        arms = self.split.sequence()
        i = 0
        while True:
            prompt = self.prompts[rng.randrange(len(self.prompts))]
            max_tokens = prompt.max_tokens if prompt.max_tokens is not None else self.output.draw(rng)
            arm = next(arms)
            drafter = None if arm == Speculation.OFF else self.drafter
            yield RequestSpec(i, prompt.text, max_tokens, arm, prompt.priority, drafter)
            i += 1


def poisson_arrivals(rate: float, *, duration_s: float | None, count: int | None, seed: int = 0) -> list[float]:
    """Arrival times (seconds from the start) of a Poisson process at ``rate``/s,
    up to ``duration_s`` and/or ``count`` arrivals (whichever ends first)."""
    if not rate > 0:
        raise WorkloadError(f"--rate must be > 0, got {rate}")
    if duration_s is None and count is None:
        raise WorkloadError("give a duration or a request count")
    rng = random.Random(seed ^ 0x5EED)
    out: list[float] = []
    t = 0.0
    while count is None or len(out) < count:
        t += rng.expovariate(rate)
        if duration_s is not None and t > duration_s:
            break
        out.append(t)
    return out


FILLER = "The quick brown fox jumps over the lazy dog while the server keeps answering. "


def long_prompt_texts(tokenizer: Any, lengths: Sequence[int]) -> list[str]:
    """Texts whose prompts (``tokenizer.encode_prompt``, chat template on, as ``spec_decode`` does)
    hold at most, and about, each of ``lengths`` tokens: a filler sentence repeated. For mixing long
    prompts into a run: prefills under load, the probes and deadlines around them."""
    per = (len(tokenizer.encode_prompt(FILLER * 20)) - len(tokenizer.encode_prompt(FILLER))) / 19
    base = len(tokenizer.encode_prompt(""))
    texts = []
    for n in lengths:
        k = max(1, int((n - base) / per))
        while k > 1 and len(tokenizer.encode_prompt(FILLER * k)) > n:
            k -= 1
        texts.append(FILLER * k)
    return texts
