"""``spec_decode`` on TensorRT-LLM engines (``model_backend: tensorrtllm``), without a GPU.

The ``target``/``draft`` models here are :mod:`trtspec.testing.fake_trtllm`: the
``tensorrtllm`` backend's interface (the config the build writes) answered by our
torch runtime, as an engine built for external draft tokens answers. What is
tested is ours: the requests ``spec_decode`` sends, how it reads the answers, and
that greedy output through it is the target's, token for token. The engines
themselves are tested where a GPU is (tests/builder/test_trtllm_gpu.py).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from trtspec.serving.triton.bls import BLSError
from trtspec.serving.triton.trtllm_bls import TrtllmLanguageModel
from trtspec.decoding import SamplingParams, greedy_accept
from trtspec.testing.fake_triton import FakeTriton, TritonError, final_value, text_of
from trtspec.testing.fake_triton import run_batch as run
from trtspec.testing.fake_trtllm import (
    EngineRequest,
    TritonPythonModel,
    fake_trtllm_deployment,
    trtllm_model_configs,
)

PROMPTS = ("The quick brown fox", "Hello world! How are", "Numbers 0 1 2", "def f(x):")
MAX_TOKENS_LIMIT = 200


@pytest.fixture(scope="module")
def pb(tiny_target: Path, tiny_draft: Path, static_policy: Path):
    # A fixed k: a seeded request repeats only when every iteration drafts the same number of tokens.
    fake = fake_trtllm_deployment(tiny_target, tiny_draft, max_tokens_limit=MAX_TOKENS_LIMIT, max_concurrency=4,
                                  policy_file=str(static_policy))
    yield fake
    fake.finalize()


def engine(pb: FakeTriton, name: str) -> TritonPythonModel:
    return pb._models[name].instance


def test_greedy_requests_through_the_engines_equal_the_target_alone(pb, reference):
    requests = [
        {"text_input": PROMPTS[0], "max_tokens": 30},
        {"text_input": PROMPTS[1], "max_tokens": 0},  # bad
        {"text_input": PROMPTS[1], "max_tokens": 25, "stream": True},
        {"text_input": PROMPTS[2], "max_tokens": 20, "speculation": "off"},
        {"text_input": "word " * 300, "max_tokens": 5},  # bad: over-long prompt
        {"text_input": PROMPTS[3], "max_tokens": 12, "stop_words": ["", ""]},
    ]
    target_before = len(engine(pb, "target").requests)
    calls = run(pb, requests)
    for i, msg in {1: "max_tokens must be > 0", 4: "leaving no room to generate"}.items():
        err = calls[i].error
        assert err is not None and err.code() == TritonError.INVALID_ARG and msg in err.message(), err
    for i in (0, 2, 3, 5):
        c, req = calls[i], requests[i]
        assert c.error is None, c.error
        ref = reference(req["text_input"], req["max_tokens"])
        assert list(final_value(c, "output_ids")) == ref.token_ids  # token for token
        assert text_of(c) == ref.text
    assert final_value(calls[3], "num_draft_tokens") == 0
    drafted, accepted = final_value(calls[0], "num_draft_tokens"), final_value(calls[0], "num_accepted_tokens")
    assert drafted > 0 and accepted / drafted > 0.5  # the tiny draft is the target plus 1% noise
    sent = engine(pb, "target").requests[target_before:]
    with_drafts = [r for r in sent if r.drafts]
    # The target got the drafts as external draft tokens, asked for k + 1 tokens, greedy.
    assert with_drafts and all(r.max_new == len(r.drafts) + 1 and r.greedy for r in with_drafts)
    # Every call to the draft asks for its greedy tokens, never more than k_max.
    assert all(r.greedy and 1 <= r.max_new <= 5 and not r.drafts for r in engine(pb, "draft").requests)


def test_sampled_requests_repeat_under_a_seed_and_each_engine_call_gets_a_fresh_seed(pb):
    req = {"text_input": PROMPTS[0], "max_tokens": 24, "temperature": 0.9, "top_k": 20, "seed": 11}
    before = len(engine(pb, "target").requests)
    a, b = run(pb, [req, req])
    c, = run(pb, [{**req, "seed": 12}])
    ids = [list(final_value(x, "output_ids")) for x in (a, b, c)]
    assert ids[0] == ids[1] and ids[0] != ids[2] and len(ids[0]) == 24
    sent = engine(pb, "target").requests[before:]
    seeds = [r.seed for r in sent]
    assert all(not r.greedy for r in sent) and None not in seeds
    assert len(set(seeds)) > len(seeds) // 3 + 1  # fresh per call (each seeded request repeats its own)


# -- the adapter on its own ----------------------------------------------------------------


@pytest.fixture(scope="module")
def engines(tiny_target: Path, tiny_draft: Path):
    fake = FakeTriton()
    for name, config in trtllm_model_configs(tiny_target, tiny_draft).items():
        fake.add_model(name, TritonPythonModel(fake), config)
    yield fake
    fake.finalize()


def test_verify_answers_greedy_acceptance_on_the_targets_argmax(engines, tiny_target: Path):
    from trtspec.runtime.torch.loader import load_model

    lm = load_model(tiny_target, "fp32", "cpu").lm
    model = TrtllmLanguageModel(engines, "target", lm.vocab_size, lm.max_context)
    prompt = [1, 17, 42, 5, 99]
    ref = lm.new_session()
    rows = ref.forward(prompt, 1)
    greedy = []
    for _ in range(4):
        greedy.append(int(rows[-1].argmax()))
        rows = ref.forward([greedy[-1]], 1)
    for drafted in ([], greedy[:3], greedy[:1] + [7, 8], [3, 3, 3, 3]):
        session = model.new_session()
        n, nxt = session.verify(prompt, drafted, SamplingParams(), None)
        scored = lm.new_session().forward(prompt + drafted, len(drafted) + 1).argmax(-1).tolist()
        assert (n, nxt) == greedy_accept(drafted, scored)
        assert session.num_cached == len(prompt) + n  # the prompt and the kept drafts
    session = model.new_session()
    assert session.verify(prompt, greedy[:3], SamplingParams(), None) == (3, greedy[3])
    assert session.verify([greedy[3]], [], SamplingParams(), None)[1] == int(
        lm.new_session().forward(prompt + greedy[:4], 1)[0].argmax())
    sent = engines._models["target"].instance.requests[-1]
    assert sent == EngineRequest(input_len=len(prompt) + 4, max_new=1, drafts=(), greedy=True, seed=None)


def test_propose_asks_the_draft_engine_for_k_greedy_tokens(engines, tiny_draft: Path):
    model = TrtllmLanguageModel(engines, "draft", 384, 256)
    session = model.new_session()
    proposal = session.propose([1, 2, 3], 4, SamplingParams(temperature=1.0), seed=5)
    assert len(proposal.tokens) == 4 and proposal.q is None
    assert session.num_cached == 3 + 3  # as propose_locally: the last draft token is not fed
    assert engines._models["draft"].instance.requests[-1] == EngineRequest(3, 4, (), True, None)
    with pytest.raises(BLSError, match="answers tokens, not logits"):
        session.forward([1], 1)
    with pytest.raises(ValueError, match="context is 256"):
        session.propose(list(range(300)), 2, SamplingParams(), None)


class _Canned:
    """A ``tensorrtllm`` model answering fixed output_ids / sequence_length (to test how they are read)."""

    def __init__(self, pb: FakeTriton) -> None:
        self.pb, self.answer = pb, (np.zeros((1, 1, 0), np.int32), np.zeros((1, 1), np.int32))

    def initialize(self, args: dict) -> None:
        pass

    def execute(self, requests: list) -> list:
        ids, n = self.answer
        return [self.pb.InferenceResponse(output_tensors=[self.pb.Tensor("output_ids", ids),
                                                          self.pb.Tensor("sequence_length", n)])
                for _ in requests]


def test_answers_are_read_with_and_without_the_input_and_nonsense_is_refused(tiny_target: Path, tiny_draft: Path):
    fake = FakeTriton()
    canned = _Canned(fake)
    fake.add_model("target", canned, trtllm_model_configs(tiny_target, tiny_draft)["target"])
    model = TrtllmLanguageModel(fake, "target", 384, 256)

    def answer(tokens: list[int], length: int | None = None) -> None:
        canned.answer = (np.array(tokens, np.int32).reshape(1, 1, -1),
                         np.array([[len(tokens) if length is None else length]], np.int32))

    answer([7, 9, 4])  # new tokens only (exclude_input_in_output)
    assert model.new_session().verify([5, 6], [7, 9], SamplingParams(), None) == (2, 4)
    answer([5, 6, 7, 3])  # an engine that still prefixes the input
    assert model.new_session().verify([5, 6], [7, 9], SamplingParams(), None) == (1, 3)
    answer([7, 9, 4, 0, 0], length=3)  # padded beyond sequence_length
    assert model.new_session().verify([5, 6], [7, 9], SamplingParams(), None) == (2, 4)
    answer([7, 9])  # a draft engine that ended the sequence after 2 of 4 tokens
    session = model.new_session()
    assert session.propose([5, 6], 4, SamplingParams(), None).tokens == (7, 9) and session.num_cached == 3
    answer([1, 2, 3, 4, 5])
    with pytest.raises(BLSError, match="answered 5 new tokens; asked for 1..3"):
        model.new_session().verify([8, 8], [7, 9], SamplingParams(), None)
    answer([])
    with pytest.raises(BLSError, match="answered 0 new tokens"):
        model.new_session().verify([8, 8], [], SamplingParams(), None)
    fake.down.add("target")
    with pytest.raises(BLSError, match="model 'target'"):
        model.probe()


def test_an_unknown_model_backend_is_refused_at_load(tiny_target: Path) -> None:
    from trtspec.builder.repo import checkpoint_facts, spec_decode_config
    from trtspec.serving.triton import spec_decode

    hf_dir, vocab, ctx = checkpoint_facts(tiny_target, None)
    config = spec_decode_config(tokenizer_dir=str(hf_dir), vocab_size=vocab, target_max_context=ctx,
                                draft_max_context=None, warmup=False, model_backend="vllm")
    with pytest.raises(ValueError, match="model_backend must be one of python, tensorrtllm, got 'vllm'"):
        fake = FakeTriton()
        fake.add_model("spec_decode", spec_decode.TritonPythonModel(fake), config)
