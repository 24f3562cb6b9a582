"""Static shapes: bucket choice, exact-mode chunking, and graph capture bookkeeping through its seam.

The capture itself (compiled layers in a CUDA graph) runs only on CUDA; here a
recorder stands in for it, so what is tested is which shapes get captured,
when, that a captured step is reused, and that sessions sharing the resident
cache give what separate eager sessions give.
"""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.utils import counters

from trtspec.runtime.torch.lean import LeanLlamaLM
from trtspec.runtime.torch.llama import LayerOps, LlamaConfig, LlamaWeights
from trtspec.runtime.torch.loader import load_model, read_config, read_tensors
from trtspec.runtime.torch.shapes import EXACT_ROWS, GRAPH_ROWS, GraphCache, ShapePlan, Step


def test_rows_buckets_pad_to_the_smallest_bucket_that_fits():
    plan = ShapePlan(rows_buckets=(1, 8, 16))
    assert [plan.rows(n) for n in (1, 2, 8, 9, 16)] == [1, 8, 8, 16, 16]
    assert plan.rows(17) is None  # longer than every bucket: one unpadded pass (a prefill)
    assert plan.chunks(40) == [40]


def test_exact_mode_gives_every_pass_the_same_rows():
    plan = ShapePlan(exact_rows=8)
    assert plan.chunks(1) == [1] and plan.chunks(8) == [8]
    assert plan.chunks(21) == [8, 8, 5]  # a prefill, a long verify: several passes, the tail padded
    assert {plan.rows(n) for n in (1, 5, 8)} == {8}


def test_windows_are_powers_of_two_capped_at_the_cache():
    plan = ShapePlan(exact_rows=8, min_window=256)
    assert [plan.window(n, 10_000) for n in (9, 256, 257, 1000, 1025)] == [256, 256, 512, 1024, 2048]
    assert plan.window(260, 264) == 264  # the last bucket is the cache itself
    with pytest.raises(AssertionError):
        plan.window(300, 264)


def test_plan_rejects_bad_buckets():
    with pytest.raises(ValueError, match="increasing"):
        ShapePlan(rows_buckets=(8, 1))
    with pytest.raises(ValueError, match="exact_rows"):
        ShapePlan(exact_rows=0)


class Recorder:
    """Stands in for CUDA capture: records each shape captured, returns the eager step."""

    def __init__(self) -> None:
        self.captured: list[tuple[int, int]] = []
        self.replays = 0

    def __call__(self, step: Step, rows: int, window: int) -> Step:
        self.captured.append((rows, window))

        def replay(ids: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
            assert ids.shape == (rows,) and pos.shape == (rows,)
            self.replays += 1
            return step(ids, pos)

        return replay


def test_graph_cache_captures_once_per_shape_and_counts_cost():
    made: list[tuple[int, int]] = []
    ticks = iter(range(100))

    def step_for(rows: int, window: int) -> Step:
        made.append((rows, window))
        return lambda ids, pos: torch.zeros(rows, 3)

    mem = iter([0, 100, 100, 250])
    cache = GraphCache(step_for, lambda step, r, w: step, memory=lambda: next(mem), clock=lambda: float(next(ticks)))
    ids, pos = torch.zeros(8, dtype=torch.int64), torch.arange(8)
    for _ in range(3):
        cache.run(ids, pos, 256)
    cache.run(ids[:1], pos[:1], 256)
    assert made == [(8, 256), (1, 256)]  # one capture per shape, reused after
    assert cache.stats.graphs == 2 and cache.stats.keys == [(8, 256), (1, 256)]
    assert cache.stats.memory_bytes == 250 and cache.stats.capture_s == 2.0
    assert (8, 256) in cache and (8, 512) not in cache


@pytest.fixture(scope="module")
def weights(tiny_target):
    return load_model(tiny_target, "bf16").lm.weights


PROMPT = [5, 17, 33, 2, 99, 150, 7, 8, 9, 300, 11]


def run(lm: LeanLlamaLM, steps: list[list[int]]) -> list[torch.Tensor]:
    s = lm.new_session()
    out = [s.forward(PROMPT, 1)]
    for toks in steps:
        out.append(s.forward(toks, len(toks)))
        s.truncate(s.num_cached - len(toks) + 1)  # keep the first of them, as a rejection would
    return out


STEPS = [[4], [40, 41, 42], [7], [1, 2, 3, 4, 5, 6, 7, 8, 9], [3]]


def test_graphed_passes_replay_one_capture_per_shape_and_match_eager(weights):
    plan = ShapePlan(rows_buckets=GRAPH_ROWS)
    rec = Recorder()
    graphed = LeanLlamaLM(weights, plan=plan, graphs=True, capture=rec)
    got = run(graphed, STEPS)
    window = plan.window(1, graphed.cache_limit)
    # the prompt (11 tokens) and the verifies pad to 16 or 8 rows, decode steps to 1; one window
    assert sorted(rec.captured) == [(1, window), (8, window), (16, window)]
    assert rec.replays == 1 + len(STEPS)
    assert graphed.graphs is not None and graphed.graphs.stats.graphs == 3
    ref = run(LeanLlamaLM(weights, plan=plan), STEPS)  # the same shapes, eager, no resident cache
    for a, b in zip(got, ref, strict=True):
        assert torch.equal(a, b)


def test_capture_common_takes_the_decode_and_verify_shapes_at_load(weights):
    rec = Recorder()
    LeanLlamaLM(weights, plan=ShapePlan(rows_buckets=GRAPH_ROWS), graphs=True, capture=rec).capture_common()
    assert [r for r, _ in rec.captured] == [1, 8]
    rec = Recorder()
    LeanLlamaLM(weights, plan=ShapePlan(exact_rows=EXACT_ROWS), graphs=True, capture=rec).capture_common()
    assert [r for r, _ in rec.captured] == [EXACT_ROWS]


def test_sessions_take_turns_in_the_resident_cache(weights):
    plan = ShapePlan(exact_rows=EXACT_ROWS)
    lm = LeanLlamaLM(weights, plan=plan, graphs=True, capture=Recorder())
    a, b = lm.new_session("a"), lm.new_session("b")
    outs_a, outs_b = [a.forward(PROMPT, 1)], [b.forward(PROMPT[:5], 1)]  # b moves a out
    outs_a.append(a.forward([4, 5], 2))  # a comes back with its tokens
    outs_b.append(b.forward([6], 1))
    b.close()
    outs_a.append(a.forward([7], 1))
    ref = LeanLlamaLM(weights, plan=plan)
    ra, rb = ref.new_session(), ref.new_session()
    ref_a = [ra.forward(PROMPT, 1), ra.forward([4, 5], 2), ra.forward([7], 1)]
    ref_b = [rb.forward(PROMPT[:5], 1), rb.forward([6], 1)]
    for x, y in zip(outs_a + outs_b, ref_a + ref_b, strict=True):
        assert torch.equal(x, y)


def test_graphs_refuse_a_dynamic_plan(weights):
    with pytest.raises(AssertionError, match="static shapes"):
        LeanLlamaLM(weights, graphs=True, capture=Recorder())



def compiled_lm(tiny_target, dtype: torch.dtype) -> LeanLlamaLM:
    """What CUDA graphs run, compiled by inductor for this CPU (the capture stays the recorder)."""
    cfg = LlamaConfig.from_hf(read_config(tiny_target))
    plain = LlamaWeights(cfg, read_tensors(tiny_target), dtype, "cpu", pack=False)
    return LeanLlamaLM(plain, plan=ShapePlan(exact_rows=EXACT_ROWS), graphs=True, capture=Recorder(),
                       ops=LayerOps.compiled())


def test_one_compiled_layer_serves_every_layer_and_writes_the_cache_in_place(tiny_target):
    torch._dynamo.reset()
    counters.clear()
    lm = compiled_lm(tiny_target, torch.float32)
    got = run(lm, STEPS[:3])
    assert lm.cfg.num_layers > 1 and counters["stats"]["unique_graphs"] == 2  # the layer (all of them), the head
    eager = LeanLlamaLM(lm.weights, plan=lm.plan)
    s = eager.new_session()
    ref = [s.forward(PROMPT, 1)]
    for a, b in zip(got, ref + run(eager, STEPS[:3])[1:], strict=True):
        torch.testing.assert_close(a, b)
    n = len(PROMPT)
    assert lm._static is not None
    cached = lm._static.k[:, :, :n]
    assert cached.abs().amax(dim=-1).gt(0).all()  # every layer, head and slot of the prompt written
    torch.testing.assert_close(cached, s._cache.k[:, :, :n])


def test_compiled_layers_keep_a_rows_bits_whichever_exact_pass_carries_it(tiny_target):
    s = compiled_lm(tiny_target, torch.bfloat16).new_session()
    s.forward(PROMPT, 0)
    alone = s.forward([4], 1)[0]
    s.truncate(len(PROMPT))
    assert torch.equal(s.forward([4, 41, 42], 3)[0], alone)  # a decode row and a verify row
