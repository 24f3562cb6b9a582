"""TensorRT-LLM's clients against spec_decode on a real tritonserver (the shared ``triton``).

The requests are built the way TensorRT-LLM's own client scripts build them
(``end_to_end_grpc_client.py``'s ``prepare_inputs``: every input a ``[1, 1]``
numpy array of TensorRT-LLM's data type, ``np_to_triton_dtype`` for the wire
type), with and without the optional inputs, streamed and not.
"""

from __future__ import annotations

import numpy as np
import pytest

from trtspec.decoding import FixedDraftLength, GenerationRequest, Penalties, SamplingParams, StopCriteria
from trtspec.serving.client import ClientError, stream_infer
from trtspec.testing.tiny import EOS_PROMPTS

PROMPT = "The quick brown fox"


def prepare_inputs(**values) -> list:
    """``tritonclient.grpc.InferInput``s as TensorRT-LLM's scripts make them: ``[[value]]`` (lists: ``[values]``)."""
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import np_to_triton_dtype

    dtypes = {"text_input": object, "max_tokens": np.int32, "stream": bool, "beam_width": np.int32,
              "temperature": np.float32, "top_k": np.int32, "top_p": np.float32, "end_id": np.int32,
              "pad_id": np.int32, "length_penalty": np.float32, "repetition_penalty": np.float32,
              "presence_penalty": np.float32, "frequency_penalty": np.float32, "min_tokens": np.int32, "min_length": np.int32,
              "seed": np.uint64, "random_seed": np.uint64, "return_log_probs": bool, "return_context_logits": bool,
              "return_generation_logits": bool, "return_perf_metrics": bool, "return_num_input_tokens": bool,
              "return_num_output_tokens": bool, "num_draft_tokens": np.int32, "use_draft_logits": bool,
              "num_return_sequences": np.int32, "exclude_input_in_output": bool, "bad_words": object,
              "stop_words": object, "lora_task_id": np.uint64, "image_url_input": object, "exact": bool,
              "top_logprobs": np.int32, "embedding_bias_words": object, "embedding_bias_weights": np.float32,
              "logit_bias_ids": np.int64, "logit_bias_values": np.float32}
    inputs = []
    for name, value in values.items():
        arr = np.array([value] if isinstance(value, list) else [[value]], dtype=dtypes[name])
        if arr.dtype == object:
            arr = np.vectorize(lambda s: s.encode("utf-8"), otypes=[object])(arr)
        inp = grpcclient.InferInput(name, list(arr.shape), np_to_triton_dtype(arr.dtype))
        inp.set_data_from_numpy(arr)
        inputs.append(inp)
    return inputs


def send(triton, **values):
    """One request; (the text of every response joined, the final response's outputs, every response)."""
    responses, _ = stream_infer(triton.endpoints.grpc, "spec_decode", prepare_inputs(**values), timeout_s=120)
    text = "".join(r.outputs["text_output"].reshape(-1)[0].decode() for r in responses)
    return text, responses[-1].outputs, responses


def scalar(outputs: dict, name: str):
    value = outputs[name].reshape(-1)[0]
    return value if isinstance(value, bytes) else value.item()


def test_the_minimal_request_with_exclude_input_in_output(triton, reference):
    text, final, _ = send(triton, text_input=PROMPT, max_tokens=20, stream=False, beam_width=1, temperature=0.0,
                          exclude_input_in_output=True)
    ref = reference(PROMPT, 20)
    assert text == ref.text
    assert scalar(final, "total_draft_tokens") == scalar(final, "num_draft_tokens") > 0
    assert scalar(final, "total_accepted_draft_tokens") == scalar(final, "num_accepted_tokens")
    assert scalar(final, "acceptance_rate") == pytest.approx(
        scalar(final, "total_accepted_draft_tokens") / scalar(final, "total_draft_tokens"))
    assert scalar(final, "batch_index") == 0 and scalar(final, "sequence_index") == 0
    assert scalar(final, "num_output_tokens") == len(ref.token_ids)


def test_exclude_input_in_output_false_repeats_the_prompt_as_tensorrt_llm_does(triton, reference):
    text, _, _ = send(triton, text_input=PROMPT, max_tokens=12, stream=False, exclude_input_in_output=False)
    assert text == PROMPT + reference(PROMPT, 12).text


def test_streaming_with_every_optional_input_at_tensorrt_llms_neutral_values(triton, reference):
    text, final, responses = send(
        triton, text_input=PROMPT, max_tokens=24, stream=True, beam_width=1, temperature=1.0,
        top_k=0, top_p=0.0,  # TensorRT-LLM: neither top-k nor top-p -> greedy
        end_id=63, pad_id=0, length_penalty=1.0, repetition_penalty=1.0, presence_penalty=0.0,
        frequency_penalty=0.0, min_tokens=1, seed=2**63 + 5, return_log_probs=False, return_context_logits=False,
        return_generation_logits=False, return_perf_metrics=True, return_num_input_tokens=True,
        return_num_output_tokens=True, num_draft_tokens=2, use_draft_logits=False, num_return_sequences=1,
        exclude_input_in_output=True, bad_words=[""], stop_words=[""])
    ref = reference(PROMPT, 24)
    eos = 63  # an arbitrary token as end_id: the answer ends at it if the greedy answer emits it
    expected = ref.token_ids[: ref.token_ids.index(eos) + 1] if eos in ref.token_ids else ref.token_ids
    assert final["output_ids"].reshape(-1).tolist() == expected  # greedy, token for token
    assert len(responses) > 2 and all(scalar(r.outputs, "sequence_index") == 0 for r in responses)
    assert scalar(final, "total_draft_tokens") > 0 and text


def test_end_id_is_the_end_of_sequence_token(triton, reference):
    ref = reference(PROMPT, 30)
    end_id = ref.token_ids[5]  # a token the greedy answer emits: it ends the answer there
    _, final, _ = send(triton, text_input=PROMPT, max_tokens=30, stream=False, end_id=end_id)
    ids = final["output_ids"].reshape(-1).tolist()
    assert ids == ref.token_ids[: ref.token_ids.index(end_id) + 1]
    assert scalar(final, "finish_reason").decode() == "stop"


def test_min_length_as_genai_perf_sends_it_gives_answers_of_max_tokens(triton, reference):
    """genai-perf's TensorRT-LLM requests with --output-tokens-mean-deterministic: min_length = max_tokens."""
    eos_prompt = next((p for p in EOS_PROMPTS if reference(p, 30).finish_reason.value == "stop"), None)
    assert eos_prompt is not None  # the precondition: an answer that EOS ends
    ref = reference(eos_prompt, 30).token_ids
    text, final, _ = send(triton, text_input=eos_prompt, max_tokens=30, min_length=30, stream=False)
    ids = final["output_ids"].reshape(-1).tolist()
    assert len(ids) == scalar(final, "num_output_tokens") == 30 and scalar(final, "total_draft_tokens") > 0
    assert ids[: len(ref) - 1] == ref[:-1] and ids[len(ref) - 1] != ref[-1]  # the same answer, another token for EOS
    streamed, streamed_final, _ = send(triton, text_input=eos_prompt, max_tokens=30, min_length=30, stream=True)
    assert streamed == text and scalar(streamed_final, "num_output_tokens") == 30
    _, off, _ = send(triton, text_input=eos_prompt, max_tokens=30, min_length=30, stream=False, num_draft_tokens=0)
    assert off["output_ids"].reshape(-1).tolist() == ids and scalar(off, "total_draft_tokens") == 0  # speculation off


def test_bad_words_are_never_in_the_answer(triton, reference, target_alone):
    ref = reference(PROMPT, 24)
    tok = target_alone.target.tokenizer
    # a token of the plain answer that is a word of its own (the word encodes to just that token)
    word = next(w for t in ref.token_ids[2:] if (w := tok.decode([t])).strip() and tok.encode_words([w]) == ((t,),))
    (banned,), = tok.encode_words([word])
    _, final, _ = send(triton, text_input=PROMPT, max_tokens=24, stream=False, bad_words=[word, ""])
    ids = final["output_ids"].reshape(-1).tolist()
    request = GenerationRequest(tuple(tok.encode_prompt(PROMPT)), StopCriteria(24, eos_token_ids=tok.eos_token_ids()),
                                bad_words=((banned,),))
    expected = target_alone.decoder().generate(request, FixedDraftLength(0)).token_ids
    assert banned not in ids and ids == expected and ids != ref.token_ids
    assert scalar(final, "total_draft_tokens") > 0


def test_penalties_have_tensorrt_llms_meaning_speculating(triton, reference, target_alone):
    """The penalties as TensorRT-LLM's clients send them: the answer is the target alone's under the same
    penalties, speculation on and off."""
    values = dict(repetition_penalty=1.5, presence_penalty=0.25, frequency_penalty=0.125)  # exact in float32
    _, final, _ = send(triton, text_input=PROMPT, max_tokens=24, stream=False, **values)
    ids = final["output_ids"].reshape(-1).tolist()
    tok = target_alone.target.tokenizer
    request = GenerationRequest(tuple(tok.encode_prompt(PROMPT)), StopCriteria(24, eos_token_ids=tok.eos_token_ids()),
                                SamplingParams(penalties=Penalties(repetition=1.5, presence=0.25, frequency=0.125)))
    assert ids == target_alone.decoder().generate(request, FixedDraftLength(0)).token_ids
    assert ids != reference(PROMPT, 24).token_ids and scalar(final, "total_draft_tokens") > 0
    # the draft model penalises its drafts over the whole sequence as the target does (without: 0.95 against 1.0 here)
    _, plain, _ = send(triton, text_input=PROMPT, max_tokens=24, stream=False)
    assert scalar(final, "acceptance_rate") >= scalar(plain, "acceptance_rate") - 0.02
    _, off, _ = send(triton, text_input=PROMPT, max_tokens=24, stream=False, num_draft_tokens=0, **values)
    assert off["output_ids"].reshape(-1).tolist() == ids


def test_embedding_bias_and_logit_bias_are_added_to_the_targets_logits_speculating(triton, reference, target_alone):
    """TensorRT-LLM's embedding_bias_words/weights (each word's tokens get its weight) and logit_bias_ids/values,
    summed: the answer is the target alone's with that bias."""
    from trtspec.decoding import LogitBias

    ref = reference(PROMPT, 24)
    tok = target_alone.target.tokenizer
    word = next(w for t in ref.token_ids[2:] if (w := tok.decode([t])).strip() and tok.encode_words([w]) == ((t,),))
    (word_id,), = tok.encode_words([word])
    other = ref.token_ids[8]
    _, final, _ = send(triton, text_input=PROMPT, max_tokens=24, stream=False, embedding_bias_words=[word, ""],
                       embedding_bias_weights=[-8.0, 3.0], logit_bias_ids=[other, word_id], logit_bias_values=[-4.0, 1.0])
    ids = final["output_ids"].reshape(-1).tolist()
    bias = LogitBias.of([(word_id, -7.0), (other, -4.0)])
    request = GenerationRequest(tuple(tok.encode_prompt(PROMPT)), StopCriteria(24, eos_token_ids=tok.eos_token_ids()),
                                SamplingParams(logit_bias=bias))
    assert ids == target_alone.decoder().generate(request, FixedDraftLength(0)).token_ids != ref.token_ids
    assert scalar(final, "total_draft_tokens") > 0
    with pytest.raises(ClientError) as info:
        send(triton, text_input=PROMPT, max_tokens=4, stream=False, logit_bias_ids=[10**6], logit_bias_values=[1.0])
    assert info.value.message.startswith("logit bias: token id 1000000 is not in the vocabulary (0..")


def test_the_draft_model_adds_the_logit_bias_too(triton, reference):
    """A bias that makes one token the target's every choice: the draft model, given the bias too, drafts
    that token every time (without it, its own choices: nearly all rejected)."""
    token = reference(PROMPT, 24).token_ids[5]
    _, final, _ = send(triton, text_input=PROMPT, max_tokens=24, stream=False, end_id=-1,
                       logit_bias_ids=[token], logit_bias_values=[60.0])
    assert final["output_ids"].reshape(-1).tolist() == [token] * 24
    assert scalar(final, "total_draft_tokens") > 10 and scalar(final, "acceptance_rate") == 1.0


def test_exact_sampling_drafts_with_the_targets_position_keyed_draws(triton):
    """In exact mode the draft model draws each draft with the noise the target's draw at that position uses
    (the request's seed travels as exact_seed), so a draft close to the target mostly matches its draws."""
    drafted = accepted = 0
    for seed in (1, 2**63 + 5, 2**64 - 1):  # the last two: beyond INT64
        _, final, _ = send(triton, text_input=PROMPT, max_tokens=32, stream=False, temperature=0.9, seed=seed,
                           exact=True)
        drafted += scalar(final, "total_draft_tokens")
        accepted += scalar(final, "total_accepted_draft_tokens")
    assert drafted > 0 and accepted / drafted > 0.6  # 72/94 here; with the generator's draws, 7/385


def test_return_log_probs_sends_each_tokens_log_probability_as_tensorrt_llm_names_them(triton, target_alone):
    """output_log_probs [1, 1, n] and cum_log_probs [1, 1]: the target alone's, speculating or not; streamed,
    each response's own tokens beside their ids, the final response the whole output's."""
    tok = target_alone.target.tokenizer
    request = GenerationRequest(tuple(tok.encode_prompt(PROMPT)), StopCriteria(24, eos_token_ids=tok.eos_token_ids()),
                                logprobs=True)
    ref = target_alone.decoder().generate(request, FixedDraftLength(0))
    for extra in (dict(), dict(num_draft_tokens=0)):
        _, final, _ = send(triton, text_input=PROMPT, max_tokens=24, stream=False, return_log_probs=True, **extra)
        assert final["output_log_probs"].shape == (1, 1, len(ref.token_ids))
        assert final["output_ids"].reshape(-1).tolist() == ref.token_ids
        assert final["output_log_probs"].reshape(-1).tolist() == pytest.approx(ref.logprobs, abs=1e-4)
        assert final["cum_log_probs"].shape == (1, 1) and scalar(final, "cum_log_probs") == pytest.approx(sum(ref.logprobs), abs=1e-3)
        assert scalar(final, "total_draft_tokens") > 0 or extra
    _, final, responses = send(triton, text_input=PROMPT, max_tokens=24, stream=True, return_log_probs=True,
                               top_logprobs=3)
    pieces = [r.outputs for r in responses[:-1]]
    assert len(pieces) > 2 and all(p["output_ids"].size == p["output_log_probs"].size for p in pieces)
    assert [t for p in pieces for t in p["output_ids"].reshape(-1).tolist()] == ref.token_ids
    assert np.concatenate([p["output_log_probs"].reshape(-1) for p in pieces]).tolist() == \
        final["output_log_probs"].reshape(-1).tolist()
    # top_logprobs 3: at each position the three most likely tokens, the greedy choice first
    assert final["top_output_ids"].shape == final["top_log_probs"].shape == (1, len(ref.token_ids), 3)
    assert final["top_output_ids"][0, :, 0].tolist() == ref.token_ids
    assert final["top_log_probs"][0, :, 0].tolist() == final["output_log_probs"].reshape(-1).tolist()
    assert np.concatenate([p["top_output_ids"][0] for p in pieces]).tolist() == final["top_output_ids"][0].tolist()
    assert (np.diff(final["top_log_probs"][0], axis=-1) <= 0).all()  # best first
    _, plain, plain_responses = send(triton, text_input=PROMPT, max_tokens=24, stream=True)
    assert "output_log_probs" not in plain and all("output_ids" not in r.outputs for r in plain_responses[:-1])


def test_num_draft_tokens_zero_is_no_speculation(triton, reference):
    text, final, _ = send(triton, text_input=PROMPT, max_tokens=16, stream=False, num_draft_tokens=0)
    assert scalar(final, "total_draft_tokens") == 0 and text == reference(PROMPT, 16).text


@pytest.mark.parametrize(("values", "message"), [
    (dict(beam_width=4), "beam_width 4: trtspec decodes one beam"),
    (dict(num_return_sequences=3), "num_return_sequences 3: trtspec returns one sequence per request"),
    (dict(return_generation_logits=True), "return_generation_logits True:"),
    (dict(repetition_penalty=0.0), "repetition_penalty must be > 0, got 0.0"),
    (dict(min_tokens=8), "min_tokens must be >= 0 and <= max_tokens (4), got 8"),
    (dict(lora_task_id=7), "lora_task_id 7: trtspec serves no LoRA adapters"),
    (dict(image_url_input="http://x/cat.png"), "image_url_input 'http://x/cat.png': trtspec serves text-only models"),
])
def test_what_trtspec_cannot_honour_is_one_invalid_arg_line_naming_the_value(triton, values, message):
    with pytest.raises(ClientError) as info:
        send(triton, text_input=PROMPT, max_tokens=4, stream=False, **values)
    assert info.value.message.startswith(message) and "\n" not in info.value.message
    assert send(triton, text_input=PROMPT, max_tokens=2, stream=False)[0]  # and the server goes on


def test_served_under_the_name_an_existing_client_calls(tmp_path, tiny_target):
    from trtspec.builder.repo import served_model_name, write_model_repo
    from trtspec.serving.launcher import ServerError, TritonServer, find_tritonserver
    from trtspec.serving.status import collect_status

    try:
        install = find_tritonserver()
    except ServerError as e:
        pytest.skip(str(e))
    repo = write_model_repo(tmp_path / "repo", target_checkpoint=tiny_target, max_tokens_limit=50,
                            model_name="ensemble")  # target alone: a lighter server
    assert served_model_name(repo) == "ensemble" and not (repo / "spec_decode").exists()
    with TritonServer(repo, log_file=tmp_path / "tritonserver.log", install=install) as triton:
        responses, _ = stream_infer(triton.endpoints.grpc, "ensemble",
                                    prepare_inputs(text_input=PROMPT, max_tokens=6, stream=False), timeout_s=120)
        assert scalar(responses[-1].outputs, "num_output_tokens") == 6
        status = collect_status(triton.endpoints.http, triton.status_dir, model="ensemble")
        assert status["ready"] and status["models"]["ensemble"]["answers"]
        assert triton.endpoints.to_dict("ensemble")["generate"].endswith("/v2/models/ensemble/generate")
