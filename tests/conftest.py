"""Shared fixtures: tiny checkpoints (seconds) and the demo pair (cached, minutes once)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

# Before torch loads OpenMP: idle OpenMP threads sleep instead of spinning. On a
# shared 2-core machine (the tests start tritonservers beside themselves) spinning
# threads make small matmuls up to 100x slower.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import pytest  # noqa: E402
import torch  # noqa: E402

from collections.abc import Callable, Iterator, Sequence  # noqa: E402

from trtspec.builder.repo import write_model_repo  # noqa: E402
from trtspec.decoding import FixedDraftLength, GenerationRequest, GenerationResult, StopCriteria  # noqa: E402
from trtspec.serving.launcher import ServerError, TritonServer, find_tritonserver  # noqa: E402
from trtspec.testing.tiny import STATIC_POLICY  # noqa: E402
from trtspec.testing.tiny import make_tiny_llama  # noqa: E402

MAX_TOKENS_LIMIT = 200  # the tiny models hold 256 tokens

# One intra-op thread: the tiny models gain nothing from two, and the demo pair's
# tests check outputs, not speed (benchmarks measure speed).
torch.set_num_threads(1)


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("tiny")


@pytest.fixture(scope="session")
def tiny_target(tiny_dir: Path) -> Path:
    return make_tiny_llama(tiny_dir / "target", seed=0)


@pytest.fixture(scope="session")
def tiny_draft(tiny_dir: Path, tiny_target: Path) -> Path:
    """A draft that mostly agrees with the target (its weights plus 1% noise)."""
    return make_tiny_llama(tiny_dir / "draft", seed=1, base=tiny_target, noise=0.01)


@pytest.fixture(scope="session")
def tiny_bad_draft(tiny_dir: Path) -> Path:
    """An unrelated random model with the same tokenizer: acceptance near zero."""
    return make_tiny_llama(tiny_dir / "bad_draft", seed=7)


@pytest.fixture(scope="session")
def tied_target(tiny_target: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny target with its LM head tied to the embedding, as SmolLM2's is."""
    from safetensors.torch import save_file

    from trtspec.runtime.torch.loader import read_config, read_tensors

    out = tmp_path_factory.mktemp("tied")
    for f in tiny_target.iterdir():
        if f.suffix != ".safetensors":
            shutil.copy(f, out / f.name)
    cfg = read_config(tiny_target)
    (out / "config.json").write_text(json.dumps({**cfg, "tie_word_embeddings": True}))
    tensors = {k: v.contiguous() for k, v in read_tensors(tiny_target).items() if k != "lm_head.weight"}
    save_file(tensors, str(out / "model.safetensors"))
    return out


@pytest.fixture(scope="session")
def tiny_pair(tiny_target: Path, tiny_draft: Path):
    from trtspec.runtime.pair import load_pair

    return load_pair(tiny_target, tiny_draft)


@pytest.fixture(scope="session")
def demo_pair_paths():
    """The real demo pair (SmolLM2-135M-Instruct + INT8 copy), prepared once into ~/.cache/trtspec."""
    from trtspec.runtime.demo import prepare_demo

    return prepare_demo()


@pytest.fixture(scope="session")
def demo_pair(demo_pair_paths):
    from trtspec.runtime.pair import load_pair

    return load_pair(demo_pair_paths.target, demo_pair_paths.draft)


@pytest.fixture(scope="session")
def static_policy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    p = tmp_path_factory.mktemp("policy") / "policy.yaml"
    p.write_text(STATIC_POLICY)
    return p


@pytest.fixture(scope="session")
def tiny_repo(tmp_path_factory: pytest.TempPathFactory, tiny_target: Path, tiny_draft: Path, static_policy: Path) -> Path:
    return write_model_repo(
        tmp_path_factory.mktemp("repo") / "model_repo",
        target_checkpoint=tiny_target,
        draft_checkpoint=tiny_draft,
        max_tokens_limit=MAX_TOKENS_LIMIT,
        max_concurrency=8,
        max_sessions=64,
        policy_file=static_policy,
    )


@pytest.fixture(scope="session")
def triton(tiny_repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TritonServer]:
    """A real tritonserver on the tiny repository, loopback only, free ports."""
    try:
        install = find_tritonserver()
    except ServerError as e:
        pytest.skip(str(e))
    server = TritonServer(tiny_repo, log_file=tmp_path_factory.mktemp("triton") / "tritonserver.log", install=install)
    server.start()
    try:
        yield server
    finally:
        server.stop()


# -- the in-process reference: what the target alone generates --------------------------


@pytest.fixture(scope="session")
def target_alone(tiny_target: Path):
    from trtspec.runtime.pair import load_pair

    return load_pair(tiny_target, None)


Reference = Callable[..., GenerationResult]


@pytest.fixture(scope="session")
def reference(target_alone) -> Reference:
    """What the target alone generates in-process for a prompt, tokenized as spec_decode does (memoised)."""
    tok = target_alone.target.tokenizer
    cache: dict = {}

    def run(text: str, max_tokens: int, stop_words: Sequence[str] = ()) -> GenerationResult:
        key = (text, max_tokens, tuple(stop_words))
        if key not in cache:
            request = GenerationRequest(
                prompt_ids=tuple(tok.encode_prompt(text)),
                stop=StopCriteria(max_new_tokens=max_tokens, eos_token_ids=tok.eos_token_ids(),
                                  stop_strings=tuple(stop_words)),
            )
            cache[key] = target_alone.decoder().generate(request, FixedDraftLength(0))
        return cache[key]

    return run
