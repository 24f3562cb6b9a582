"""``trtspec serve`` (a real process, stopped by a signal) and ``trtspec generate --url`` (CliRunner)."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import urllib.request
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from trtspec.builder.repo import write_model_repo
from trtspec.cli.main import app
from trtspec.serving.launcher import ServerError, find_tritonserver
from trtspec.testing.serve import serve_process



def test_generate_url_grpc_and_http_json(triton, reference):
    runner = CliRunner()
    ref = reference("The quick brown fox", 24)
    for url, extra in ((triton.endpoints.grpc, []), (triton.endpoints.http, ["--http"])):
        result = runner.invoke(app, ["generate", "--url", url, "--prompt", "The quick brown fox", "-n", "24", "--json", *extra])
        assert result.exit_code == 0, result.output
        out = json.loads(result.stdout)
        assert out["text"] == ref.text and out["output_ids"] == ref.token_ids
        assert out["protocol"] == ("http" if extra else "grpc") and out["num_draft_tokens"] > 0


def test_generate_url_sends_the_penalties(triton, target_alone):
    """``--repetition-penalty`` and the others reach spec_decode: the answer is the target alone's under them."""
    from trtspec.decoding import FixedDraftLength, GenerationRequest, Penalties, SamplingParams, StopCriteria

    args = ["generate", "--url", triton.endpoints.grpc, "-p", "Numbers 0 1 2", "-n", "24", "--json"]
    result = CliRunner().invoke(app, args + ["--repetition-penalty", "1.5", "--presence-penalty", "0.5",
                                             "--frequency-penalty", "0.25"])
    assert result.exit_code == 0, result.output
    tok = target_alone.target.tokenizer
    sampling = SamplingParams(penalties=Penalties(repetition=1.5, presence=0.5, frequency=0.25))
    request = GenerationRequest(tuple(tok.encode_prompt("Numbers 0 1 2")),
                                StopCriteria(24, eos_token_ids=tok.eos_token_ids()), sampling)
    expected = target_alone.decoder().generate(request, FixedDraftLength(0)).token_ids
    plain = json.loads(CliRunner().invoke(app, args).stdout)["output_ids"]
    assert json.loads(result.stdout)["output_ids"] == expected != plain


def test_generate_url_logprobs_are_the_target_alones(triton, target_alone):
    """``--logprobs``: spec_decode's output_log_probs, over gRPC (streamed, whole at the end) and HTTP."""
    from trtspec.decoding import FixedDraftLength, GenerationRequest, StopCriteria

    tok = target_alone.target.tokenizer
    request = GenerationRequest(tuple(tok.encode_prompt("Hello world")), StopCriteria(16, eos_token_ids=tok.eos_token_ids()),
                                logprobs=True)
    ref = target_alone.decoder().generate(request, FixedDraftLength(0))
    for url, extra in ((triton.endpoints.grpc, []), (triton.endpoints.http, ["--http"])):
        args = ["generate", "--url", url, "-p", "Hello world", "-n", "16", "--logprobs", *extra]
        out = json.loads(CliRunner().invoke(app, args + ["--json", "--top-logprobs", "2"]).stdout)
        assert out["output_ids"] == ref.token_ids and out["logprobs"] == pytest.approx(ref.logprobs, abs=1e-4)
        assert [[i for i, _ in top] for top in out["top_logprobs"]] == [[t, top[1][0]] for t, top in
                                                                      zip(ref.token_ids, out["top_logprobs"])]
        assert [top[0][1] for top in out["top_logprobs"]] == pytest.approx(out["logprobs"], abs=1e-6)
        streamed = CliRunner().invoke(app, args)
        assert streamed.exit_code == 0 and _logprob_sum(streamed.stderr) == pytest.approx(sum(ref.logprobs), abs=2e-3)


def _logprob_sum(stats: str) -> float:
    return float(re.search(r"logprob sum (-?[0-9.]+) \(mean", stats).group(1))


def test_generate_url_streams_text_then_stats(triton, reference):
    result = CliRunner().invoke(app, ["generate", "--url", triton.endpoints.grpc, "-p", "Hello world", "-n", "16"])
    assert result.exit_code == 0
    assert result.stdout == reference("Hello world", 16).text + "\n"
    assert "[stats] 16 tokens" in result.stderr


def test_generate_url_server_error_is_one_cli_error_line(triton):
    result = CliRunner().invoke(app, ["generate", "--url", triton.endpoints.grpc, "-p", "x", "-n", "0"])
    assert result.exit_code == 1
    assert result.stderr.strip() == "error: max_tokens must be > 0, got 0"


def test_generate_url_without_a_server_is_a_clear_error(tmp_path):
    from trtspec.serving.launcher import free_port

    port = free_port()
    result = CliRunner().invoke(app, ["generate", "--url", f"127.0.0.1:{port}", "--http", "-p", "x"])
    assert result.exit_code == 1 and result.stderr.startswith(f"error: cannot reach 127.0.0.1:{port}")


def test_generate_url_on_the_grpc_port_with_http_is_one_clear_line(triton):
    grpc = triton.endpoints.grpc
    result = CliRunner().invoke(app, ["generate", "--url", grpc, "--http", "-p", "x", "-n", "2"])
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit), result.exception  # not a traceback
    assert result.stderr.startswith(f"error: {grpc} did not answer in HTTP (")
    assert result.stderr.endswith("); is it Triton's HTTP port?\n") and result.stderr.count("\n") == 1


def test_generate_url_on_a_port_that_speaks_http_1_says_why_grpc_failed():
    """The gRPC stream's own error, not tritonclient's "The stream is no longer in valid state" (the
    OpenAI endpoint's port, uvicorn: it refuses the HTTP/2 preface before the request is sent)."""
    from trtspec.serving.openai_api.app import ProxySettings
    from trtspec.serving.openai_api.server import OpenAIServer

    settings = ProxySettings(triton_grpc="127.0.0.1:1", model="spec_decode", served_name="spec_decode",
                             max_tokens_limit=16, tokenizer=None)
    with OpenAIServer(settings.triton_grpc, settings=settings) as web:
        url = web.url.removeprefix("http://")
        result = CliRunner().invoke(app, ["generate", "--url", url, "-p", "x", "-n", "2"])
    assert result.exit_code == 1 and result.stderr.count("\n") == 1, result.stderr
    assert "http1.x server" in result.stderr and "no longer in valid state" not in result.stderr, result.stderr


@pytest.fixture(scope="module")
def target_only_repo(tmp_path_factory, tiny_target: Path) -> Path:
    """No draft: a lighter server to start and stop (and the target-alone deployment)."""
    return write_model_repo(tmp_path_factory.mktemp("solo") / "repo", target_checkpoint=tiny_target, max_tokens_limit=100)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_serve_prints_endpoints_serves_and_stops_cleanly_on_a_signal(target_only_repo, tmp_path, sig):
    try:
        find_tritonserver()
    except ServerError as e:
        pytest.skip(str(e))
    log_file = tmp_path / "server.log"
    with serve_process(target_only_repo, log_file, "--openai-api-key", "k3y",
                       "--openai-model-name", "org/tiny") as (proc, info):
        server_pid = info["pid"]
        http = info["endpoints"]["http"]
        assert urllib.request.urlopen(f"{http}/v2/health/ready", timeout=10).status == 200
        body = json.dumps({"text_input": "Hello", "max_tokens": 4, "speculation": "off"}).encode()
        out = json.loads(urllib.request.urlopen(urllib.request.Request(info["endpoints"]["generate"], data=body), timeout=60).read())
        assert out["num_output_tokens"] == 4 and out["num_draft_tokens"] == 0
        openai_url = info["endpoints"]["openai"]  # the OpenAI-compatible endpoint beside it
        body = json.dumps({"model": "org/tiny", "prompt": "Hello", "max_tokens": 4, "temperature": 0}).encode()
        req = urllib.request.Request(f"{openai_url}/completions", data=body, headers={"Content-Type": "application/json"})
        with pytest.raises(urllib.error.HTTPError) as unauthorized:  # --openai-api-key: /v1/* asks for it
            urllib.request.urlopen(req, timeout=60)
        assert unauthorized.value.code == 401
        req.add_header("Authorization", "Bearer k3y")
        completion = json.loads(urllib.request.urlopen(req, timeout=60).read())
        assert completion["usage"]["completion_tokens"] == 4 and completion["choices"][0]["text"] == out["text_output"]
        assert completion["model"] == "org/tiny"  # --openai-model-name: the id clients name
        models = urllib.request.Request(f"{openai_url}/models/org/tiny", headers={"Authorization": "Bearer k3y"})
        assert json.loads(urllib.request.urlopen(models, timeout=30).read())["id"] == "org/tiny"
        status = json.loads(urllib.request.urlopen(info["endpoints"]["status"], timeout=60).read())
        assert status["ready"] and status["models"]["target"]["answers"] and "draft" not in status["models"]
        # no draft model: requests draft with the default drafter, ngram, which needs none
        assert status["speculation"] == "on" and status["speculation_reason"].startswith("drafter ngram")
        proc.send_signal(sig)
        assert proc.wait(timeout=60) == 0, proc.stderr.read()
    with pytest.raises(ProcessLookupError):
        os.kill(server_pid, 0)  # tritonserver is gone too
    with pytest.raises(OSError):  # and so is the OpenAI endpoint
        urllib.request.urlopen(f"{openai_url}/models", timeout=10)
    assert "successfully unloaded 'target'" in log_file.read_text()


def test_serve_exits_non_zero_when_tritonserver_dies_under_it(target_only_repo, tmp_path):
    """Triton can abort on its own (docs/reliability.md, "A stub killed mid-call"): ``trtspec serve``
    must then exit with an error, its front doors closed, so a process manager starts it again."""
    try:
        find_tritonserver()
    except ServerError as e:
        pytest.skip(str(e))
    with serve_process(target_only_repo, tmp_path / "server.log", "--status-port", "-1") as (proc, info):
        assert "status" not in info["endpoints"]  # -1: no status endpoint (the last --status-port given wins)
        os.kill(info["pid"], signal.SIGKILL)
        assert proc.wait(timeout=60) == 1
        err = proc.stderr.read()
    assert "error: tritonserver exited on its own with code -9" in err, err
    with pytest.raises(OSError):  # the OpenAI endpoint is gone with it
        urllib.request.urlopen(f"{info['endpoints']['openai']}/models", timeout=10)


def _serve(*args: str):
    from trtspec.cli.serve import serve

    serve_app = typer.Typer()
    serve_app.command()(serve)
    return CliRunner().invoke(serve_app, list(args))


def test_serve_refuses_a_directory_that_is_not_a_model_repository(tmp_path):
    result = _serve("--model-repo", str(tmp_path))
    assert result.exit_code == 1 and "is not a trtspec model repository" in result.stderr


@pytest.mark.parametrize("option", ["--http-port", "--grpc-port", "--metrics-port", "--status-port", "--openai-port"])
def test_serve_refuses_a_taken_port_before_starting_the_server(target_only_repo, option):
    """At once, naming the option: tritonserver would bind its ports only after loading every model
    (minutes for a large one), and its error would not say which option to change. The message, one
    line, is the check's own: no server ran (its failure would read "tritonserver failed to start ...")."""
    ports = {"--http-port": "0", "--grpc-port": "0", "--metrics-port": "0", "--status-port": "0", "--openai-port": "-1"}
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        ports[option] = str(port)
        result = _serve("--model-repo", str(target_only_repo), "--host", "127.0.0.1",
                        *(x for kv in ports.items() for x in kv))
    assert result.exit_code == 1
    assert result.stderr == f"error: {option} {port}: cannot listen on 127.0.0.1:{port}: Address already in use\n"


def test_serve_refuses_an_api_key_without_the_openai_endpoint(target_only_repo, monkeypatch):
    monkeypatch.setenv("TRTSPEC_OPENAI_API_KEY", "k3y")  # the key is read from the environment too
    result = _serve("--model-repo", str(target_only_repo))
    assert result.exit_code == 1 and result.stderr == "error: --openai-api-key needs --openai-port\n"


@pytest.mark.parametrize(("args", "says"), [
    (["--openai-model-name", "org/m"], "--openai-model-name needs --openai-port"),
    (["--openai-model-name", " ", "--openai-port", "0"], "--openai-model-name is empty"),
])
def test_serve_refuses_an_openai_model_name_it_cannot_serve(target_only_repo, args, says):
    result = _serve("--model-repo", str(target_only_repo), *args)
    assert result.exit_code == 1 and result.stderr == f"error: {says}\n"


def test_serve_refuses_one_port_asked_twice(target_only_repo):
    result = _serve("--model-repo", str(target_only_repo), "--host", "127.0.0.1", "--http-port", "18080",
                    "--grpc-port", "0", "--metrics-port", "0", "--status-port", "18080")
    assert result.exit_code == 1 and result.stderr == "error: --http-port and --status-port are both 18080\n"
