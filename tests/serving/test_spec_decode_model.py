"""``spec_decode`` model.py in-process: several requests in one execute (bad ones among them),
streaming, cancellation, a failing draft or target. BLS calls reach real ``target``/``draft``
models through the fake pb_utils; the end-to-end tests prove the same under tritonserver."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trtspec.serving.triton.spec_decode import TritonPythonModel
from trtspec.testing.fake_triton import FakeTriton, TritonError, fake_deployment
from trtspec.testing.fake_triton import final_value, run_batch as run, text_of

MAX_TOKENS_LIMIT = 200  # the tiny models hold 256 tokens
PROMPTS = ("The quick brown fox", "Hello world! How are", "Numbers 0 1 2", "def f(x):")


@pytest.fixture(scope="module")
def pb(tiny_target: Path, tiny_draft: Path, static_policy: Path):
    fake = fake_deployment(
        tiny_target, tiny_draft, max_tokens_limit=MAX_TOKENS_LIMIT, max_concurrency=4, policy_file=str(static_policy)
    )
    yield fake
    fake.finalize()




def test_warm_up_runs_the_loop_without_touching_the_models(pb):
    model = pb._models["spec_decode"].instance
    calls = dict(pb.bls_calls)
    took = model.service.warm_up()  # fake_deployment loads with warm-up off; run it by hand
    assert took > 0 and pb.bls_calls == calls  # in-process dummies only: draft/target warm themselves


def test_one_execute_with_good_and_bad_requests(pb, reference):
    requests = [
        {"text_input": PROMPTS[0], "max_tokens": 30},
        {"text_input": PROMPTS[1], "max_tokens": 0},  # bad: caught while parsing, in execute
        {"text_input": PROMPTS[1], "max_tokens": 25, "stream": True},
        {"text_input": PROMPTS[2], "max_tokens": 20, "speculation": "maybe"},  # bad
        {"text_input": "word " * 300, "max_tokens": 5},  # bad: over-long prompt, caught on the worker
        {"text_input": PROMPTS[2], "max_tokens": 20, "speculation": "off"},
        {"text_input": PROMPTS[3], "max_tokens": MAX_TOKENS_LIMIT + 1},  # bad: above the limit
        {"max_tokens": 3},  # bad: rejected by Triton before the model (required input missing)
        {"text_input": PROMPTS[3], "max_tokens": 12, "stop_words": ["", ""], "bad_words": [""]},
    ]
    calls = run(pb, requests)
    bad = {
        1: "max_tokens must be > 0, got 0",
        3: "speculation must be one of auto, on, off; got 'maybe'",
        4: "tokens; the context window holds 256, leaving no room to generate",
        6: f"max_tokens must be <= {MAX_TOKENS_LIMIT} (this server's limit), got {MAX_TOKENS_LIMIT + 1}",
        7: "missing required input 'text_input'",
    }
    for i, msg in bad.items():
        err = calls[i].error
        assert err is not None and err.code() == TritonError.INVALID_ARG, (i, err)
        assert msg in err.message() and "\n" not in err.message()
        assert len(calls[i].responses) == 1  # the error IS the final response
    for i in (0, 2, 5, 8):
        c, req = calls[i], requests[i]
        assert c.error is None, c.error
        ref = reference(req["text_input"], req["max_tokens"])
        assert list(final_value(c, "output_ids")) == ref.token_ids  # greedy: the target's tokens, exactly
        assert text_of(c) == ref.text
        assert final_value(c, "num_output_tokens") == len(ref.token_ids)
        assert final_value(c, "finish_reason").decode() == ref.finish_reason.value
    assert final_value(calls[5], "num_draft_tokens") == 0  # speculation off: target alone
    drafted, accepted = final_value(calls[0], "num_draft_tokens"), final_value(calls[0], "num_accepted_tokens")
    assert drafted > 0 and 0 <= accepted <= drafted
    assert final_value(calls[0], "acceptance_rate") == pytest.approx(accepted / drafted)
    assert len(calls[2].responses) > 2  # streamed: several text chunks, then the final one
    assert calls[2].outputs("text_output")[-1].reshape(-1)[0] == b""  # the final carries stats, no text


def test_streaming_chunks_arrive_before_the_final_response(pb):
    seen = []
    (call,) = [pb.client_request("spec_decode", {"text_input": PROMPTS[0], "max_tokens": 40, "stream": True})]
    call.sender.on_send = lambda resp, flags: seen.append(flags)
    pb.execute("spec_decode", [call])
    call.wait(60)
    assert seen[-1] == 1 and all(f == 0 for f in seen[:-1]) and len(seen) >= 3


def test_cancellation_stops_the_loop(pb):
    call = pb.client_request("spec_decode", {"text_input": PROMPTS[0], "max_tokens": 150, "stream": True, "speculation": "off"})
    call.sender.on_send = lambda resp, flags: call.request.cancel()  # the client goes away after the first chunk
    model = pb._models["spec_decode"].instance
    before = model.service.outcomes.copy()
    pb.execute("spec_decode", [call])
    call.wait(60)
    assert call.sender.final_count == 1
    assert call.error is not None and call.error.code() == TritonError.CANCELLED
    assert call.error.message() == "request cancelled by the client"
    text_chunks = [r for r in call.responses if not r.has_error()]
    assert len(text_chunks) == 1  # the loop stopped at the next iteration
    assert model.service.outcomes["cancelled"] == before["cancelled"] + 1


def wait_healthy(pb: FakeTriton, which: str, timeout_s: float = 30.0) -> None:
    """Poll until spec_decode's supervisor says ``which`` (draft | target) is healthy again.
    The fake has no model-loading API: the supervisor re-probes with backoff until it answers."""
    import time

    sup = getattr(pb._models["spec_decode"].instance.health, which)
    deadline = time.monotonic() + timeout_s
    while not sup.healthy:
        assert time.monotonic() < deadline, f"{which} never recovered: {sup.snapshot()}"
        time.sleep(0.05)


def test_a_dead_draft_costs_speed_not_correctness(pb, reference):
    pb.down.add("draft")
    try:
        (c,) = run(pb, [{"text_input": PROMPTS[1], "max_tokens": 30}])
        calls = pb.bls_calls.get("draft", 0)
        (d,) = run(pb, [{"text_input": PROMPTS[2], "max_tokens": 10}])  # routed around the known-dead draft
        assert pb.bls_calls.get("draft", 0) - calls <= 2  # at most the supervisor's probe, no draft per request
    finally:
        pb.down.discard("draft")
        wait_healthy(pb, "draft")
    ref = reference(PROMPTS[1], 30)
    assert c.error is None and list(final_value(c, "output_ids")) == ref.token_ids
    assert final_value(c, "num_draft_tokens") == 0
    assert d.error is None and list(final_value(d, "output_ids")) == reference(PROMPTS[2], 10).token_ids
    (e,) = run(pb, [{"text_input": PROMPTS[1], "max_tokens": 30}])  # recovered: speculating again
    assert final_value(e, "num_draft_tokens") > 0


def test_a_dead_target_is_unavailable_and_one_line(pb):
    pb.down.add("target")
    try:
        calls = run(pb, [{"text_input": PROMPTS[1], "max_tokens": 5}, {"text_input": PROMPTS[0], "max_tokens": 0}])
    finally:
        pb.down.discard("target")
        wait_healthy(pb, "target")
    assert calls[0].error.code() == TritonError.UNAVAILABLE
    assert calls[0].error.message().startswith("model 'target' failed: ")
    assert "\n" not in calls[0].error.message()
    assert calls[1].error.code() == TritonError.INVALID_ARG


def test_seeded_sampling_repeats(pb):
    req = {"text_input": PROMPTS[3], "max_tokens": 20, "temperature": 1.0, "top_k": 50, "seed": 7}
    a, b = run(pb, [req, dict(req)])
    assert a.error is None and list(final_value(a, "output_ids")) == list(final_value(b, "output_ids"))


def test_speculation_on_with_the_draft_model_but_none_deployed_is_refused(tiny_target: Path):
    """Without a draft model the repository's default drafter is ngram: ``on`` is served by it."""
    pb = fake_deployment(tiny_target, None, max_tokens_limit=50)
    try:
        calls = run(pb, [{"text_input": "x", "max_tokens": 3, "speculation": "on", "drafter": "model"},
                         {"text_input": "x", "max_tokens": 3, "speculation": "on"},
                         {"text_input": "x", "max_tokens": 3, "speculation": "off"}])
    finally:
        pb.finalize()
    assert calls[0].error.code() == TritonError.INVALID_ARG and "needs a draft model" in calls[0].error.message()
    assert calls[1].error is None and calls[2].error is None
    assert final_value(calls[2], "num_draft_tokens") == 0


def test_outcomes_are_counted(pb):
    model = pb._models["spec_decode"].instance
    before = model.service.outcomes.copy()
    run(pb, [{"text_input": "a", "max_tokens": 2}, {"text_input": "b", "max_tokens": -1}])
    after = model.service.outcomes
    assert after["ok"] == before["ok"] + 1 and after["invalid"] == before["invalid"] + 1


def test_a_non_decoupled_config_is_refused_at_load(tiny_target: Path):
    from trtspec.builder.repo import checkpoint_facts, spec_decode_config

    d, vocab, ctx = checkpoint_facts(tiny_target, None)
    cfg = spec_decode_config(tokenizer_dir=str(d), vocab_size=vocab, target_max_context=ctx, draft_max_context=None)
    cfg["model_transaction_policy"] = {"decoupled": False}
    with pytest.raises(ValueError, match="must be decoupled"):
        TritonPythonModel(FakeTriton()).initialize({"model_config": json.dumps(cfg)})


def test_models_run_half_their_threads_while_several_requests_speculate(pb, reference):
    target = pb._models["target"].instance
    asked: list[int] = []
    saved = target.set_threads, target._threads, target._threads_now
    target.set_threads, target._threads, target._threads_now = asked.append, 4, 4
    try:
        calls = run(pb, [{"text_input": p, "max_tokens": 24} for p in PROMPTS])
        assert all(c.error is None for c in calls)
        assert 2 in asked  # draft and target computed at once: half the threads each
        (alone,) = run(pb, [{"text_input": PROMPTS[0], "max_tokens": 8}])
        assert alone.error is None and asked[-1] == 4  # one request: they take turns, all threads again
        assert text_of(alone) == reference(PROMPTS[0], 8).text  # threads change speed, never tokens
    finally:
        target.set_threads, target._threads, target._threads_now = saved
