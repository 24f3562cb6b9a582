"""One request's result as ``trtspec bench`` saw it, and the per-request figures derived from it.

Times are seconds from the run's start (one ``time.perf_counter`` base).

- ``arrival_s``: when the request was due (open loop: its Poisson arrival;
  closed loop: when a worker took it). ``sent_s``: when it went on the wire;
  ``sent_s - arrival_s`` is the client's own lag.
- ``chunks``: one entry per streamed response that carried text, as
  ``(seconds after sending, characters)``. ``spec_decode`` sends one response
  per draft-verify iteration, so a chunk can carry several tokens.
- TTFT: sending -> the first chunk. End-to-end: sending -> the final response.
- Inter-token latency (ITL): one observation per chunk after the first, the gap
  since the previous chunk divided by the chunk's tokens (what the server's
  ``trtspec_inter_token_latency_seconds`` histogram does). The client is not
  told how many tokens a chunk carries, only the request's total
  (``num_output_tokens``): :func:`chunk_tokens` gives every chunk one token and
  shares the rest in proportion to the chunks' characters beyond their first.
  That is exact when every chunk is one token (speculation off) and an
  estimate otherwise.
- TPOT (time per output token after the first): ``(e2e - ttft) / (tokens - 1)``;
  the SLO on inter-token latency is checked against it.
- ``drafted`` / ``accepted``: from the final response (``num_draft_tokens``,
  ``num_accepted_tokens``).

Errors keep the server's one-line message and a category (:func:`categorize`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

# Error categories, each a way a sent request can end without an answer.
TIMEOUT = "timeout"  # no final response within the request timeout (bench cancelled it)
REFUSED = "refused"  # the server could not be reached (connection refused, DNS, no route)
UNAVAILABLE = "unavailable"  # the server answered UNAVAILABLE (model down, shutting down)
INVALID = "invalid"  # the server refused the request (INVALID_ARG)
CANCELLED = "cancelled"  # cancelled on the server side, or the run was interrupted
INTERNAL = "internal"  # the server's internal error
OTHER = "other"
CATEGORIES = (TIMEOUT, REFUSED, UNAVAILABLE, INVALID, CANCELLED, INTERNAL, OTHER)

_CODE_CATEGORY = {
    "INVALID_ARG": INVALID,
    "StatusCode.INVALID_ARGUMENT": INVALID,
    "UNAVAILABLE": UNAVAILABLE,
    "StatusCode.UNAVAILABLE": UNAVAILABLE,
    "CANCELLED": CANCELLED,
    "StatusCode.CANCELLED": CANCELLED,
    "INTERNAL": INTERNAL,
    "StatusCode.INTERNAL": INTERNAL,
    "StatusCode.DEADLINE_EXCEEDED": TIMEOUT,
    "NOT_FOUND": INVALID,
}

# Message fragments (lower case) -> category, checked in order. Over gRPC
# streaming Triton delivers an error's message without its code, so the
# message is all there is.
_MESSAGE_RULES: tuple[tuple[str, str], ...] = (
    ("connection refused", REFUSED),
    ("failed to connect", REFUSED),
    ("cannot reach", REFUSED),
    ("name or service not known", REFUSED),
    ("no route to host", REFUSED),
    ("timed out", TIMEOUT),
    ("deadline exceeded", TIMEOUT),
    ("no final response within", TIMEOUT),
    ("cancelled", CANCELLED),
    ("canceled", CANCELLED),
    ("shutting down", UNAVAILABLE),
    ("unavailable", UNAVAILABLE),
    ("not healthy", UNAVAILABLE),
    ("failed:", UNAVAILABLE),  # "model 'target' failed: ..."
    ("internal error", INTERNAL),
    ("must be", INVALID),
    ("missing required input", INVALID),
    ("unknown model", INVALID),
    ("data-type", INVALID),
    ("prompt has", INVALID),
)


def categorize(message: str, code: str | None = None) -> str:
    """The category of an error, from its transport code when there is one, else its message."""
    low = message.lower()
    # A connection that never came up is "refused", though gRPC calls it UNAVAILABLE.
    for fragment, category in _MESSAGE_RULES:
        if category == REFUSED and fragment in low:
            return category
    if code and code in _CODE_CATEGORY:
        return _CODE_CATEGORY[code]
    for fragment, category in _MESSAGE_RULES:
        if fragment in low:
            return category
    return OTHER


@dataclass
class RequestRecord:
    index: int
    arm: str  # the speculation value sent: auto | on | off
    max_tokens: int
    arrival_s: float
    sent_s: float | None = None
    done_s: float | None = None  # final response (or error) received
    chunks: list[tuple[float, int]] = field(default_factory=list)  # (seconds after sending, characters)
    input_tokens: int = 0
    output_tokens: int = 0
    drafted: int = 0
    accepted: int = 0
    finish_reason: str | None = None
    error: str | None = None  # the one-line message
    error_category: str | None = None

    @property
    def sent(self) -> bool:
        return self.sent_s is not None

    @property
    def answered(self) -> bool:
        return self.sent and self.error is None and self.done_s is not None

    @property
    def lag_s(self) -> float | None:
        return None if self.sent_s is None else self.sent_s - self.arrival_s

    @property
    def ttft_s(self) -> float | None:
        return self.chunks[0][0] if self.answered and self.chunks else None

    @property
    def e2e_s(self) -> float | None:
        if not self.answered:
            return None
        assert self.done_s is not None and self.sent_s is not None
        return self.done_s - self.sent_s

    @property
    def tpot_s(self) -> float | None:
        e2e, ttft = self.e2e_s, self.ttft_s
        if e2e is None or ttft is None or self.output_tokens < 2:
            return None
        return max(0.0, e2e - ttft) / (self.output_tokens - 1)

    @property
    def speculated(self) -> bool:
        return self.drafted > 0

    def chunk_tokens(self) -> list[int]:
        return chunk_tokens([c for _, c in self.chunks], self.output_tokens)

    def itl_s(self) -> list[float]:
        """One inter-token latency per chunk after the first: gap / tokens in the chunk."""
        if not self.answered or len(self.chunks) < 2:
            return []
        tokens = self.chunk_tokens()
        times = [t for t, _ in self.chunks]
        return [(times[i] - times[i - 1]) / tokens[i] for i in range(1, len(times))]

    def mean_chunk_interval_s(self) -> float | None:
        """(last chunk - first chunk) / (chunks - 1): the request's mean time per iteration."""
        if len(self.chunks) < 2:
            return None
        return (self.chunks[-1][0] - self.chunks[0][0]) / (len(self.chunks) - 1)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["chunks"] = [[round(t, 6), c] for t, c in self.chunks]
        return d

    @classmethod
    def from_dict(cls, d: dict) -> RequestRecord:
        fields = {k: v for k, v in d.items() if k in cls.__dataclass_fields__}
        fields["chunks"] = [(float(t), int(c)) for t, c in d.get("chunks", [])]
        return cls(**fields)


def chunk_tokens(chars: list[int], total_tokens: int) -> list[int]:
    """``total_tokens`` shared among chunks in proportion to their characters, at least 1 each
    (largest remainder, so the shares sum to ``max(total_tokens, len(chars))``)."""
    n = len(chars)
    if n == 0:
        return []
    extra = max(0, total_tokens - n)  # tokens beyond one per chunk
    weights = [max(0, c - 1) for c in chars]  # characters beyond each chunk's first token's one
    wsum = sum(weights)
    if extra == 0:
        return [1] * n
    if wsum == 0:
        weights, wsum = [1] * n, n
    exact = [extra * w / wsum for w in weights]
    shares = [int(x) for x in exact]
    left = extra - sum(shares)
    order = sorted(range(n), key=lambda i: (-(exact[i] - shares[i]), i))
    for i in order[:left]:
        shares[i] += 1
    return [1 + s for s in shares]
