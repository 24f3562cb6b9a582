"""``trtspec generate``: one request, in-process (``--local``) or against a server."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated

import typer

from trtspec.cli.common import JsonOpt, domain_errors, fail, log, print_json
from trtspec.decoding.types import DrafterKind, LogitBias
from trtspec.wire import Speculation


def generate(
    prompt: Annotated[str, typer.Option("--prompt", "-p", help="Prompt text.")],
    local: Annotated[bool, typer.Option("--local", help="Run the models in this process.")] = False,
    demo: Annotated[bool, typer.Option("--demo", help="Use the embedded demo pair (prepared on first use).")] = False,
    target: Annotated[Path | None, typer.Option("--target", help="Target checkpoint: HF dir or .gguf.")] = None,
    draft: Annotated[Path | None, typer.Option("--draft", help="Draft checkpoint: HF dir or .gguf.")] = None,
    max_tokens: Annotated[int, typer.Option("--max-tokens", "-n", help="Most new tokens.")] = 128,
    k: Annotated[int, typer.Option("--k", help="Draft tokens per iteration.")] = 5,
    speculation: Annotated[Speculation, typer.Option("--speculation", help="auto (a server decides) or on: draft and verify; off: the target alone.")] = Speculation.AUTO,
    drafter: Annotated[DrafterKind | None, typer.Option("--drafter", help="model (default in-process): the draft model; ngram/suffix: lookups in the text (no draft model needed); auto: a free drafter or the model, per iteration. With --url, default: the server's.")] = None,
    temperature: Annotated[float, typer.Option("--temperature", help="0 is greedy.")] = 0.0,
    top_p: Annotated[float, typer.Option("--top-p")] = 1.0,
    top_k: Annotated[int, typer.Option("--top-k", help="0 disables top-k.")] = 0,
    seed: Annotated[int | None, typer.Option("--seed")] = None,
    stop: Annotated[list[str] | None, typer.Option("--stop", help="Stop string (repeatable).")] = None,
    min_tokens: Annotated[int, typer.Option("--min-tokens", help="No EOS among the first N tokens: the target chooses among the others (vLLM's min_tokens, TensorRT-LLM's min_length).")] = 0,
    ignore_eos: Annotated[bool, typer.Option("--ignore-eos", help="EOS does not end the answer: it runs to --max-tokens (TensorRT-LLM's end_id -1).")] = False,
    bad_word: Annotated[list[str] | None, typer.Option("--bad-word", help="A word the text never contains, encoded as given (repeatable; TensorRT-LLM's bad_words).")] = None,
    repetition_penalty: Annotated[float, typer.Option("--repetition-penalty", help="Logits of tokens already in the text (prompt included) divided by it, multiplied when negative; 1: none (TensorRT-LLM's).")] = 1.0,
    presence_penalty: Annotated[float, typer.Option("--presence-penalty", help="Subtracted from the logits of tokens already in the text, prompt included (TensorRT-LLM's).")] = 0.0,
    frequency_penalty: Annotated[float, typer.Option("--frequency-penalty", help="Times a token's count in the text, prompt included, subtracted from its logit (TensorRT-LLM's).")] = 0.0,
    logit_bias: Annotated[list[str] | None, typer.Option("--logit-bias", help="ID=VALUE: VALUE added to token ID's logit before the temperature and the penalties (repeatable; OpenAI's logit_bias).")] = None,
    logprobs: Annotated[bool, typer.Option("--logprobs", help="Each token's log-probability (--json: a list beside the token ids; else their sum on stderr; TensorRT-LLM's return_log_probs).")] = False,
    top_logprobs: Annotated[int, typer.Option("--top-logprobs", help="With --logprobs: also the N most likely tokens at each position (0..20; --json: [id, logprob] pairs, best first).")] = 0,
    raw: Annotated[bool, typer.Option("--raw", help="Send the prompt as is, without the chat template.")] = False,
    target_precision: Annotated[str, typer.Option("--target-precision", help="auto|fp32|bf16|fp16|int8|int4")] = "auto",
    draft_precision: Annotated[str, typer.Option("--draft-precision", help="auto|fp32|bf16|fp16|int8|int4 (int4: CPU; the layers' matrices from the float weights; with --demo, auto is int4 where it runs well, else the INT8 copy)")] = "auto",
    exact: Annotated[bool | None, typer.Option("--exact/--no-exact", help="Same output with speculation on or off, bit for bit (default: on with CUDA, off on CPU).")] = None,
    url: Annotated[str | None, typer.Option("--url", help="A running server, HOST:PORT (gRPC; the HTTP port with --http).")] = None,
    http: Annotated[bool, typer.Option("--http", help="With --url: Triton's HTTP generate endpoints.")] = False,
    json_out: JsonOpt = False,
) -> None:
    """Generate text for one prompt; streams to stdout (or one JSON object with --json)."""
    from trtspec.errors import InvalidRequestError
    from trtspec.runtime.pair import load_pair
    from trtspec.decoding import FixedDraftLength, GenerationRequest, Penalties, SamplingParams, StopCriteria

    penalties = Penalties(repetition_penalty, presence_penalty, frequency_penalty)
    bias = _logit_bias(logit_bias or ())

    if url is not None:
        if local or demo or target or draft:
            fail("--url talks to a running server; --local/--demo/--target/--draft do not apply")
        if exact is not None:
            fail("--exact/--no-exact choose how local models run; a server's target decides for itself")
        from trtspec.cli.client import remote_generate

        remote_generate(url=url, prompt=prompt, http=http, max_tokens=max_tokens,
                        speculation=Speculation.OFF if k == 0 else speculation,
                        drafter=drafter.value if drafter is not None else None,
                        temperature=temperature, top_p=top_p, top_k=top_k, seed=seed, stop=stop,
                        min_tokens=min_tokens, ignore_eos=ignore_eos, bad_words=bad_word, penalties=penalties,
                        logit_bias=bias, logprobs=logprobs, top_logprobs=top_logprobs, json_out=json_out)
        return
    if not local:
        fail("pass --local (models in this process) or --url HOST:PORT (a running server)")
    drafter = drafter or DrafterKind.MODEL
    if demo:
        if target or draft:
            fail("--demo and --target/--draft are mutually exclusive")
        target, draft, draft_precision = _demo_paths(draft_precision, json_out)
    if target is None:
        fail("--target (or --demo) is required")
    if k < 0:
        fail(f"--k must be >= 0, got {k}")
    use_draft = speculation is not Speculation.OFF and k > 0
    if use_draft and draft is None and drafter is DrafterKind.MODEL:
        fail("--draft is required with --drafter model unless --speculation off (or pass --drafter ngram|suffix)")
    with domain_errors():
        pair = load_pair(
            target,
            draft if use_draft and drafter in (DrafterKind.MODEL, DrafterKind.AUTO) else None,
            target_precision=target_precision,  # type: ignore[arg-type]
            draft_precision=draft_precision,  # type: ignore[arg-type]
            progress=lambda m: log(m, quiet=json_out),
            exact=exact,
        )
        tok = pair.target.tokenizer
        if not prompt:
            raise InvalidRequestError("prompt is empty")
        request = GenerationRequest(
            prompt_ids=tuple(tok.encode_prompt(prompt, raw=raw)),
            stop=StopCriteria(
                max_new_tokens=max_tokens,
                eos_token_ids=frozenset() if ignore_eos else tok.eos_token_ids(),
                stop_strings=tuple(stop or ()),
                min_new_tokens=min_tokens,
            ),
            sampling=SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, seed=seed,
                                    exact=pair.target.exact, penalties=penalties, logit_bias=bias),
            drafter=drafter,
            bad_words=tok.encode_words(bad_word or ()),
            logprobs=logprobs,
            top_logprobs=top_logprobs,
        )
        gen = pair.decoder().stream(request, FixedDraftLength(k if use_draft else 0))
        for chunk in gen:
            if not json_out and chunk.text:
                sys.stdout.write(chunk.text)
                sys.stdout.flush()
    _report(gen.result, pair, k if use_draft else 0, drafter.value if use_draft else None, json_out)


def _logit_bias(items: Sequence[str]) -> LogitBias:
    """``--logit-bias ID=VALUE`` options as a :class:`LogitBias` (a bad one: a CLI error naming it)."""
    pairs = []
    for item in items:
        token, sep, value = item.partition("=")
        try:
            pairs.append((int(token), float(value if sep else "")))
        except ValueError:
            fail(f"--logit-bias takes ID=VALUE (a token id and a number), got {item!r}")
    return LogitBias.of(pairs)


def _demo_paths(draft_precision: str, json_out: bool) -> tuple[Path, Path, str]:
    """The demo pair's target and, for ``draft_precision``, draft (prepared on first use), and the
    draft's precision: ``auto`` is int4 where it runs well, as for ``trtspec demo``."""
    from trtspec.runtime.demo import prepare_demo
    from trtspec.runtime.torch.loader import resolve_device

    with domain_errors():
        paths = prepare_demo(progress=lambda m: log(f"[demo] {m}", quiet=json_out))
        precision = paths.draft_precision(draft_precision, resolve_device())
    return paths.target, paths.draft_at(precision), precision


def _report(result, pair, k: int, drafter: str | None, json_out: bool) -> None:
    """The result: one JSON object (with the models, k, drafter, exact) on stdout, or stats on stderr."""
    if json_out:
        out = result.to_dict()
        out["models"] = pair.describe()
        out["k"] = k
        out["drafter"] = drafter
        out["exact"] = pair.target.exact
        print_json(out)
        return
    sys.stdout.write("\n")
    s = result.stats
    rate = f"{s.acceptance_rate:.1%}" if s.acceptance_rate is not None else "n/a"
    tps = s.emitted_tokens / s.total_time_s if s.total_time_s else 0.0
    log(
        f"[stats] {s.emitted_tokens} tokens in {s.total_time_s:.2f}s ({tps:.1f} tok/s), "
        f"{s.iterations} iterations, acceptance {rate}, finish={result.finish_reason.value}{logprob_sum(result.logprobs)}"
    )


def logprob_sum(logprobs: list[float] | None) -> str:
    """The stats line's words for the tokens' log-probabilities ("" when none were asked)."""
    if not logprobs:
        return ""
    return f", logprob sum {sum(logprobs):.3f} (mean {sum(logprobs) / len(logprobs):.3f} per token)"
