"""The TensorRT-LLM path for real: build engines for a small pair, then serve them with Triton.

Runs only where an NVIDIA GPU and TensorRT-LLM 1.0-1.2 exist (e.g. inside the
image the top-level Dockerfile builds); skipped elsewhere, with the reason.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

from trtspec.builder import trtllm
from trtspec.builder.manifest import verify_engines
from trtspec.builder.pipeline import BuildOptions, run_build
from trtspec.builder.quantize import ProbeSettings
from trtspec.serving.client import GenerateParams, generate_http
from trtspec.serving.launcher import free_ports
from trtspec.testing.tiny import make_tiny_llama

pytestmark = pytest.mark.gpu

TRITON_BIN = Path("/opt/tritonserver/bin/tritonserver")
TRTLLM_BACKEND = Path("/opt/tritonserver/backends/tensorrtllm")


def _skip_reason() -> str | None:
    try:
        trtllm.require_trtllm()
    except Exception as e:  # TrtllmUnavailableError, or a CUDA runtime that cannot start
        return str(e)
    return None


@pytest.fixture(scope="module")
def trt_build(tmp_path_factory: pytest.TempPathFactory):
    reason = _skip_reason()
    if reason:
        pytest.skip(reason)
    root = tmp_path_factory.mktemp("trt")
    # Small, but with shapes TensorRT-LLM's kernels take (head_dim 64, widths multiple of 64).
    dims = dict(hidden_size=256, intermediate_size=512, num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                max_position_embeddings=512)
    target = make_tiny_llama(root / "target", seed=0, **dims)
    draft = make_tiny_llama(root / "draft", seed=1, base=target, noise=0.01)
    opts = BuildOptions(target=target, draft=draft, name="tiny", engines_dir=root / "engines",
                        model_repo=root / "model_repo", backend="trtllm", max_sessions=2,
                        probe=ProbeSettings(num_prompts=1, max_new_tokens=8))
    return opts, run_build(opts)


def test_engines_are_built_and_recorded(trt_build) -> None:
    opts, result = trt_build
    e = result.engine_dir
    for role in ("target", "draft"):
        assert (e / role / "config.json").is_file() and list((e / role).glob("*.engine")), role
    assert not (e / "work").exists()
    m = verify_engines(e, "trtllm")
    assert m.gpu and m.gpu["compute_capability"] and m.versions.tensorrt_llm == trtllm.trtllm_version()
    assert m.models["draft"].precision == "w8a16"
    assert run_build(opts).reused  # idempotent: nothing rebuilt


def test_triton_serves_the_engines_with_external_draft_tokens(trt_build) -> None:
    _, result = trt_build
    if not (TRITON_BIN.is_file() and TRTLLM_BACKEND.is_dir()):
        pytest.skip(f"no Triton with the tensorrtllm backend at {TRITON_BIN.parent.parent}")
    httpclient = pytest.importorskip("tritonclient.http")
    http, grpc, metrics = free_ports(3)
    proc = subprocess.Popen(
        [str(TRITON_BIN), f"--model-repository={result.model_repo}", f"--http-port={http}",
         f"--grpc-port={grpc}", f"--metrics-port={metrics}"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        client = httpclient.InferenceServerClient(f"127.0.0.1:{http}")
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                pytest.fail("tritonserver exited:\n" + (proc.stdout.read() if proc.stdout else ""))
            try:
                if all(client.is_model_ready(m) for m in ("target", "draft", "spec_decode")):
                    break
            except Exception:  # not listening yet
                pass
            time.sleep(1)
        else:
            pytest.fail("target/draft/spec_decode not ready within 300 s")

        prompt = np.array([[1, 5, 9, 30, 7]], dtype=np.int32)

        def infer(model: str, n: int, draft_tokens: np.ndarray | None = None) -> np.ndarray:
            tensors = {
                "input_ids": prompt,
                "input_lengths": np.array([[prompt.shape[1]]], dtype=np.int32),
                "request_output_len": np.array([[n]], dtype=np.int32),
                "end_id": np.array([[2]], dtype=np.int32),
                "pad_id": np.array([[2]], dtype=np.int32),
            }
            if draft_tokens is not None:
                tensors["draft_input_ids"] = draft_tokens
            inputs = []
            for name, arr in tensors.items():
                i = httpclient.InferInput(name, list(arr.shape), "INT32")
                i.set_data_from_numpy(arr)
                inputs.append(i)
            out = client.infer(model, inputs, outputs=[httpclient.InferRequestedOutput("output_ids")])
            return out.as_numpy("output_ids")

        drafted = infer("draft", 4)
        assert drafted.shape[-1] >= 1
        verified = infer("target", 1, draft_tokens=drafted.reshape(1, -1)[:, :4].astype(np.int32))
        assert verified.shape[-1] >= 1

        # spec_decode drives the engines (model_backend: tensorrtllm): greedy output with
        # speculation equals the target engine alone, token for token.
        def generate(speculation: str):
            params = GenerateParams(max_tokens=32, speculation=speculation)
            return generate_http(f"127.0.0.1:{http}", "The quick brown fox", params)

        on, off = generate("on"), generate("off")
        assert on.output_ids == off.output_ids and 0 < len(off.output_ids) <= 32
        assert on.num_draft_tokens > 0 and off.num_draft_tokens == 0
        assert on.num_accepted_tokens / on.num_draft_tokens > 0.5  # the draft is the target plus 1% noise
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
