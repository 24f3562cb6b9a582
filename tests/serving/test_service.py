"""``spec_decode``'s request service without Triton: real tiny models in this process, answers
recorded by a reply object. (The Triton adapter around it: test_spec_decode_model.py.)"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from trtspec.errors import ModelCallError
from trtspec.obs.sinks import PrometheusClientSink
from trtspec.serving.service import RequestService
from trtspec.testing.tiny import STATIC_POLICY
from trtspec.wire import SpecDecodeParams

PROMPT = "The quick brown fox"


class Recorder:
    """A reply: streamed text, then exactly one final answer or error."""

    def __init__(self, on_text=None) -> None:
        self.texts: list[str] = []
        self.pieces: list = []  # each streamed piece's StreamChunk (log-probabilities asked), else None
        self.final = None  # (text, result, num_input_tokens)
        self.error = None  # (code, message)
        self.cancelled = False
        self.answers = 0
        self.done = threading.Event()
        self._on_text = on_text

    def is_cancelled(self) -> bool:
        return self.cancelled

    def send_text(self, text: str, tokens=None) -> None:
        self.texts.append(text)
        self.pieces.append(tokens)
        if self._on_text is not None:
            self._on_text(self)

    def send_final(self, text, result, num_input_tokens) -> None:
        self.final = (text, result, num_input_tokens)
        self._answered()

    def send_error(self, message: str, code: str) -> None:
        self.error = (code, message)
        self._answered()

    def _answered(self) -> None:
        self.answers += 1
        self.done.set()

    def wait(self) -> Recorder:
        assert self.done.wait(60), "no final answer"
        return self


class Log:
    def __init__(self) -> None:
        self.lines: list[tuple[str, str]] = []

    def log_info(self, m: str) -> None:
        self.lines.append(("info", m))

    def log_warn(self, m: str) -> None:
        self.lines.append(("warn", m))

    def log_error(self, m: str) -> None:
        self.lines.append(("error", m))


class DownLM:
    """The target, but every forward fails the way a dead remote model does."""

    def __init__(self, inner) -> None:
        self.vocab_size, self.max_context = inner.vocab_size, inner.max_context

    def new_session(self, session_id: str = "") -> DownLM:
        return self

    num_cached = 0

    def forward(self, token_ids, num_logits):
        raise ModelCallError("model 'target' failed: gone\nsecond line")

    def truncate(self, length: int) -> None:
        pass

    def close(self) -> None:
        pass


def make_service(pair, with_draft: bool = True, target=None, refusal=None, **params) -> RequestService:
    t = pair.target
    cfg = SpecDecodeParams(tokenizer_dir=str(t.path), vocab_size=t.lm.vocab_size,
                           target_max_context=t.lm.max_context, draft_model="draft" if with_draft else "",
                           draft_max_context=t.lm.max_context if with_draft else 0, **params)
    service = RequestService(cfg, t.tokenizer, PrometheusClientSink(), model="spec_decode", log=Log())
    service.start(target or t.lm, pair.draft.lm if with_draft else None, target_refusal=refusal)
    return service


@pytest.fixture(scope="module")
def service(tiny_pair, static_policy: Path) -> Iterator[RequestService]:
    # a fixed k: whether drafting pays on this machine's timings is not what these tests check
    s = make_service(tiny_pair, max_tokens_limit=100, max_concurrency=2, policy_file=str(static_policy))
    yield s
    s.close()


def ask(service: RequestService, **inputs) -> Recorder:
    reply = Recorder()
    service.submit(reply, inputs.get, request_id="r")
    return reply.wait()


def requests_counted(service: RequestService, outcome: str) -> float:
    registry = service.metrics.sink.registry  # type: ignore[attr-defined]
    return registry.get_sample_value("trtspec_requests_total", {"model": "spec_decode", "outcome": outcome}) or 0.0


def test_a_request_streams_then_answers_with_the_targets_tokens(service, reference):
    before = service.outcomes["ok"]
    streamed = ask(service, text_input=PROMPT, max_tokens=30, stream=True)
    whole = ask(service, text_input=PROMPT, max_tokens=30)
    ref = reference(PROMPT, 30)
    for reply in (streamed, whole):
        assert reply.error is None and reply.answers == 1
        text, result, n_in = reply.final
        assert result.token_ids == ref.token_ids and n_in > 0  # greedy: the target's tokens exactly
        assert result.stats.drafted_tokens > 0
    assert "".join(streamed.texts) == ref.text and streamed.final[0] == ""  # the final carries counts, no text
    assert whole.texts == [] and whole.final[0] == ref.text
    assert service.outcomes["ok"] == before + 2 and service.in_flight == 0


def test_a_bad_request_is_refused_before_a_worker_takes_it(service):
    before = requests_counted(service, "invalid")
    for inputs, message in (
        ({"text_input": PROMPT, "max_tokens": 0}, "max_tokens must be > 0, got 0"),
        ({"text_input": PROMPT, "max_tokens": 101}, "max_tokens must be <= 100 (this server's limit), got 101"),
        ({"text_input": PROMPT, "max_tokens": 5, "priority": "urgent"}, "priority must be one of high, normal, low"),
    ):
        reply = Recorder()
        service.submit(reply, inputs.get)
        assert reply.done.is_set() and reply.error[0] == "INVALID_ARG" and message in reply.error[1]
    assert requests_counted(service, "invalid") == before + 3


def test_a_prompt_longer_than_the_context_is_the_clients_error(service):
    reply = ask(service, text_input="word " * 300, max_tokens=5)
    assert reply.error[0] == "INVALID_ARG" and "the context window holds 256" in reply.error[1]


def test_cancelling_stops_the_loop_at_the_next_iteration(service):
    def cancel(reply: Recorder) -> None:
        reply.cancelled = True

    reply = Recorder(on_text=cancel)
    service.submit(reply, {"text_input": PROMPT, "max_tokens": 80, "stream": True, "speculation": "off"}.get)
    reply.wait()
    assert reply.error == ("CANCELLED", "request cancelled by the client") and len(reply.texts) == 1


def test_beyond_concurrency_and_queue_requests_are_shed(tiny_pair):
    service = make_service(tiny_pair, max_concurrency=1, max_queue=0)
    release = threading.Event()
    first = Recorder(on_text=lambda _r: release.wait(30))  # holds the only worker
    try:
        service.submit(first, {"text_input": PROMPT, "max_tokens": 20, "stream": True}.get)
        second = Recorder()
        service.submit(second, {"text_input": PROMPT, "max_tokens": 5}.get)
        assert second.error == ("UNAVAILABLE", "server busy: 1 requests in flight; unavailable, retry later")
    finally:
        release.set()
    assert first.wait().error is None and service.outcomes["unavailable"] == 1
    service.close()
    late = Recorder()
    service.submit(late, {"text_input": PROMPT, "max_tokens": 5}.get)
    assert late.error == ("UNAVAILABLE", "the server is shutting down") and service.in_flight == 0


def test_a_failing_target_is_unavailable_in_one_line(tiny_pair):
    failing = make_service(tiny_pair, with_draft=False, target=DownLM(tiny_pair.target.lm))
    down: list[str] = []
    known_down = make_service(tiny_pair, refusal=lambda: down[0] if down else None)
    try:
        assert ask(failing, text_input=PROMPT, max_tokens=5).error == ("UNAVAILABLE", "model 'target' failed: gone")
        assert ask(known_down, text_input=PROMPT, max_tokens=5).error is None
        down.append("model 'target' is down (reloading)")  # what the supervisor says: fail fast, no call
        assert ask(known_down, text_input=PROMPT, max_tokens=5).error == ("UNAVAILABLE", down[0])
        assert failing.outcomes["unavailable"] == known_down.outcomes["unavailable"] == 1
    finally:
        failing.close()
        known_down.close()


def test_speculation_on_without_a_draft_is_refused_and_auto_runs_the_target(tiny_pair, reference):
    service = make_service(tiny_pair, with_draft=False)
    try:
        on = ask(service, text_input=PROMPT, max_tokens=5, speculation="on")
        assert on.error[0] == "INVALID_ARG" and "needs a draft model" in on.error[1]
        auto = ask(service, text_input=PROMPT, max_tokens=8)
        assert auto.final[1].token_ids == reference(PROMPT, 8).token_ids
        assert auto.final[1].stats.drafted_tokens == 0
    finally:
        service.close()


def test_without_a_draft_model_the_free_drafters_speculate(tiny_pair, reference):
    service = make_service(tiny_pair, with_draft=False, default_drafter="ngram")
    registry = service.metrics.sink.registry  # type: ignore[attr-defined]

    def routed(route: str) -> float:
        return sum(s.value for m in registry.collect() if m.name == "trtspec_route_decisions"
                   for s in m.samples if s.labels.get("route") == route and s.name.endswith("_total"))
    try:
        by_default = ask(service, text_input=PROMPT, max_tokens=12)  # the deployment's default: ngram
        suffix = ask(service, text_input=PROMPT, max_tokens=12, drafter="suffix")
        for reply in (by_default, suffix):
            assert reply.final[1].token_ids == reference(PROMPT, 12).token_ids
        assert set(suffix.final[1].stats.drafted_by) <= {"suffix"}
        assert routed("speculate") == 2  # no draft model, yet both speculated
        model = ask(service, text_input=PROMPT, max_tokens=4, drafter="model")
        assert model.final[1].stats.drafted_tokens == 0 and routed("target_only") == 1
        bad = ask(service, text_input=PROMPT, max_tokens=4, drafter="lookup")
        assert bad.error == ("INVALID_ARG", "drafter must be one of model, ngram, suffix, auto; got 'lookup'")
    finally:
        service.close()


def test_the_policys_exact_makes_a_seed_give_the_same_sample_with_speculation_on_or_off(tiny_pair, tmp_path):
    policy = tmp_path / "policy.yaml"
    policy.write_text(STATIC_POLICY + "exact: true\n")
    service = make_service(tiny_pair, policy_file=str(policy))
    try:
        sampled = dict(text_input=PROMPT, max_tokens=24, temperature=1.0, seed=11)
        on, off = (ask(service, **sampled, speculation=s).final[1] for s in ("on", "off"))
        assert on.stats.drafted_tokens > 0 and off.stats.drafted_tokens == 0
        assert on.token_ids == off.token_ids
    finally:
        service.close()


def test_warm_up_runs_the_loop_on_dummies(service):
    assert service.warm_up() > 0


def test_num_draft_tokens_caps_the_policys_k_and_passes_outcomes_on():
    from trtspec.serving.service import _at_most

    class Scripted:
        def __init__(self) -> None:
            self.ks, self.seen = [5, 2, 4], []

        def next_k(self) -> int:
            return self.ks.pop(0)

        def observe(self, outcome) -> None:
            self.seen.append(outcome)

    policy = Scripted()
    capped = _at_most(policy, 3)
    assert [capped.next_k() for _ in range(3)] == [3, 2, 3]  # 5 -> 3, 2 stays, 4 -> 3
    capped.observe("outcome")
    assert policy.seen == ["outcome"]
    assert _at_most(policy, None) is policy  # no cap asked: the policy itself


def test_num_draft_tokens_keeps_the_policys_drafter_choice():
    from trtspec.serving.service import _at_most

    class Chooser:
        def next_k(self) -> int:
            return 5

        def next_drafter(self, names) -> str:
            return names[-1]

        def observe(self, outcome) -> None:
            pass

    assert _at_most(Chooser(), 2).next_drafter(["suffix", "model"]) == "model"  # auto still chooses
