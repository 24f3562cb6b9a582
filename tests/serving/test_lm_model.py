"""``draft``/``target`` model.py: execute with several requests at once, bad ones among them."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from trtspec.builder.repo import lm_config
from trtspec.serving.triton import lm
from trtspec.testing.fake_triton import FakeTriton, Tensor, TritonError


@pytest.fixture(scope="module")
def served(tiny_target: Path):
    pb = FakeTriton()
    model = pb.add_model("target", lm.TritonPythonModel(pb), lm_config("target", checkpoint=str(tiny_target), max_sessions=4))
    yield pb, model
    pb.finalize()


def call(pb, session: str, ids, num_logits: int, release: bool | None = None, ids_dtype=np.int64,
         cpu_share: int | None = None, argmax: bool | None = None):
    inputs = {
        "session_id": np.array([session.encode()], dtype=object),
        "token_ids": np.asarray(ids, dtype=ids_dtype),
        "num_logits": np.array([num_logits], dtype=np.int32),
    }
    if release is not None:
        inputs["release"] = np.array([release], dtype=bool)
    if cpu_share is not None:
        inputs["cpu_share"] = np.array([cpu_share], dtype=np.int32)
    if argmax is not None:
        inputs["return_argmax"] = np.array([argmax], dtype=bool)
    return pb.client_request("target", inputs)


def reference(model, ids, num_logits):
    s = model.store.lm.new_session()
    out = s.forward(list(ids), num_logits)
    s.close()
    return out.numpy()


def test_warm_up_ran_at_load_and_left_no_session(served):
    pb, model = served
    assert model.warmup_s is not None and model.warmup_s > 0
    assert len(model.store) == 0


def test_one_execute_with_good_and_bad_requests(served):
    pb, model = served
    a, b = [3, 14, 15, 92, 65], [2, 71, 82, 81, 82, 84]
    calls = [
        call(pb, "a", a, 1),  # good: prefill
        call(pb, "x", [1, 2], 3),  # bad: more logits than tokens
        call(pb, "b", b, 2),  # good
        call(pb, "y", [1, 5000], 1),  # bad: token outside the vocabulary
        call(pb, "", [1, 2], 1),  # bad: no session id
        call(pb, "a", a + [35], 2),  # good: same session, in the same batch
        call(pb, "z", [1, 2], 1, ids_dtype=np.int32),  # rejected by Triton itself: wrong data type
    ]
    pb.execute("target", calls)
    for c in calls:
        assert c.sender.final_count == 1 and len(c.responses) == 1

    def logits(c):
        assert c.error is None, c.error
        return c.outputs("logits")[0]

    np.testing.assert_allclose(logits(calls[0]), reference(model, a, 1), atol=1e-4)
    np.testing.assert_allclose(logits(calls[2]), reference(model, b, 2), atol=1e-4)
    np.testing.assert_allclose(logits(calls[5]), reference(model, a + [35], 2), atol=1e-4)
    expected = {
        1: "num_logits must be in [0, 2] (the sequence length), got 3",
        3: "token ids must be in [0, 384)",
        4: "session_id must be a non-empty string",
        6: "data-type is 'int32', but model 'target' expects 'TYPE_INT64'",
    }
    for i, message in expected.items():
        err = calls[i].error
        assert err is not None and err.code() == TritonError.INVALID_ARG
        assert message in err.message() and "\n" not in err.message() and "Traceback" not in err.message()


def test_release_frees_the_cache_and_answers_empty_logits(served):
    pb, model = served
    pb.execute("target", [call(pb, "r", [5, 6, 7], 1)])
    assert "r" in model.store
    (c,) = pb.execute("target", [call(pb, "r", [], 0, release=True)])
    assert c.error is None and c.outputs("logits")[0].shape == (0, 384)
    assert "r" not in model.store


def test_an_internal_failure_is_internal_and_one_line(served, monkeypatch):
    pb, model = served

    def boom(*_a, **_k):
        raise RuntimeError("CUDA error: out of memory\nwith a second line")

    monkeypatch.setattr(model.store, "run", boom)
    release = call(pb, "q", [], 0, release=True)  # does not run the model: still answered
    failing, release = pb.execute("target", [call(pb, "q", [1, 2], 1), release])
    assert failing.error.code() == TritonError.INTERNAL
    assert failing.error.message() == "target failed: RuntimeError: CUDA error: out of memory"
    assert release.error is None


def test_logits_are_float32_batch_free(served):
    pb, _ = served
    (c,) = pb.execute("target", [call(pb, "f", [4, 5, 6, 7], 3)])
    out = c.outputs("logits")[0]
    assert out.dtype == np.float32 and out.shape == (3, 384)
    assert torch.isfinite(torch.from_numpy(out)).all()
    assert isinstance(c.responses[0].output_tensors()[0], Tensor)


def test_cpu_share_runs_a_share_of_the_threads_and_bad_values_are_refused(served):
    pb, model = served
    asked: list[int] = []
    saved = model.set_threads, model._threads, model._threads_now
    model.set_threads, model._threads, model._threads_now = asked.append, 4, 4

    def shared(session: str, share: int) -> object:
        return call(pb, session, [3, 14, 15], 1, cpu_share=share)

    try:
        calls = [shared("s1", 2), shared("s2", 2), shared("s3", 1), shared("s4", 0)]
        pb.execute("target", calls)
        assert asked == [2, 4]  # halved for the first, unchanged for the second, all again for the third
        assert all(c.error is None for c in calls[:3])
        np.testing.assert_allclose(calls[0].outputs("logits")[0], reference(model, [3, 14, 15], 1), atol=1e-4)
        err = calls[3].error
        assert err is not None and err.code() == TritonError.INVALID_ARG
        assert "cpu_share must be an integer >= 1, got 0" in err.message()
    finally:
        model.set_threads, model._threads, model._threads_now = saved


def test_return_argmax_answers_the_argmax_of_each_row_instead_of_the_rows(served):
    pb, model = served
    seq = [5, 9, 2, 6, 5, 3]
    calls = [call(pb, "am", seq, 3, argmax=True), call(pb, "lg", seq, 3, argmax=False)]
    pb.execute("target", calls)
    assert all(c.error is None for c in calls)
    ids, logits = calls[0].outputs("argmax_ids")[0], calls[0].outputs("logits")[0]
    assert ids.dtype == np.int64 and logits.shape == (0, model.store.lm.vocab_size)  # no rows cross
    assert ids.tolist() == reference(model, seq, 3).argmax(axis=-1).tolist()
    assert calls[1].outputs("argmax_ids")[0].size == 0 and calls[1].outputs("logits")[0].shape[0] == 3


def test_the_memory_gauge_is_sent_only_when_the_caches_change(tiny_target, monkeypatch):
    """Each metric call from a Python model is a round trip to the server: not one per execute."""
    pb = FakeTriton()
    model = pb.add_model("target", lm.TritonPythonModel(pb), lm_config("target", checkpoint=str(tiny_target)))
    sink, sent = model._memory._sink, []
    real = sink.set
    monkeypatch.setattr(sink, "set", lambda spec, labels, value: (sent.append(value), real(spec, labels, value)))
    weights = model.loaded.weight_bytes
    run = lambda ids, n, **kw: pb.execute("target", [call(pb, "mem", ids, n, **kw)])[0]  # noqa: E731
    run([3, 14, 15], 1)
    grown = weights + model.store.cache_bytes()
    assert grown > weights and sent == [grown]
    for t in range(1, 5):  # decoding within the cache's capacity: the same bytes, nothing sent
        assert run([3, 14, 15] + [7] * t, 1).error is None
    assert sent == [grown]
    run([], 0, release=True)
    assert model.store.cache_bytes() == 0 and sent == [grown, weights]
    pb.finalize()
