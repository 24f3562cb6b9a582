"""The client half of ``trtspec generate``: ``--url HOST:PORT [--http]`` against a running server.

:func:`remote_generate` is the body ``generate`` calls when given ``--url``.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from trtspec.cli.common import domain_errors, log, print_json
from trtspec.decoding.types import LogitBias, Penalties


def remote_generate(
    *,
    url: str,
    prompt: str,
    http: bool = False,
    max_tokens: int = 128,
    speculation: str = "auto",
    drafter: str | None = None,
    temperature: float = 0.0,
    top_p: float = 1.0,
    top_k: int = 0,
    seed: int | None = None,
    stop: Sequence[str] | None = None,
    min_tokens: int = 0,
    ignore_eos: bool = False,
    bad_words: Sequence[str] | None = None,
    penalties: Penalties = Penalties(),
    logit_bias: LogitBias = LogitBias(),
    logprobs: bool = False,
    top_logprobs: int = 0,
    json_out: bool = False,
    timeout_s: float = 600.0,
) -> None:
    """One request to the ``spec_decode`` model at ``url`` (gRPC, or HTTP ``generate`` endpoints with ``http``).

    Streams text to stdout as it arrives (``--json``: one JSON object at the end);
    a server error becomes ``error: <its one-line message>`` and exit code 1.
    """
    from trtspec.cli.generate import logprob_sum
    from trtspec.serving.client import GenerateParams, generate

    params = GenerateParams(
        max_tokens=max_tokens,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        seed=seed,
        stop_words=tuple(stop or ()),
        speculation=speculation,
        drafter=drafter,
        min_tokens=min_tokens or None,
        end_id=-1 if ignore_eos else None,
        bad_words=tuple(bad_words or ()),
        penalties=penalties,
        logit_bias=logit_bias,
        logprobs=logprobs,
        top_logprobs=top_logprobs,
    )

    def show(text: str) -> None:
        sys.stdout.write(text)
        sys.stdout.flush()

    with domain_errors():
        result = generate(
            url, prompt, params, http=http, stream=not json_out, on_text=None if json_out else show, timeout_s=timeout_s
        )
    if json_out:
        out = result.to_dict()
        out["url"] = url
        print_json(out)
        return
    sys.stdout.write("\n")
    rate = f"{result.acceptance_rate:.1%}" if result.acceptance_rate is not None else "n/a"
    ttft = f"{result.ttft_s * 1000:.0f} ms" if result.ttft_s is not None else "n/a"
    log(
        "[stats] "
        f"{result.num_output_tokens} tokens in {result.total_s:.2f}s ({result.tokens_per_s:.1f} tok/s), "
        f"TTFT {ttft}, acceptance {rate}, finish={result.finish_reason} ({result.protocol}){logprob_sum(result.logprobs)}"
    )
