"""What the client sends: ``grpc_inputs`` turns values into Triton inputs, and refuses one that the wire
cannot carry as given, naming the input, before anything is sent."""

from __future__ import annotations

import numpy as np
import pytest

from trtspec.serving.client import ClientError, GenerateParams, error_code, generate_http, grpc_inputs
from trtspec.serving.launcher import free_port


def test_values_become_batch_of_one_inputs_of_the_models_types():
    inputs = {i.name(): i for i in grpc_inputs({"text_input": "héllo", "max_tokens": 7, "random_seed": 2**64 - 1})}
    assert inputs["text_input"].datatype() == "BYTES" and inputs["text_input"].shape() == [1, 1]
    assert inputs["max_tokens"].datatype() == "INT32" and inputs["random_seed"].datatype() == "UINT64"
    assert np.frombuffer(inputs["max_tokens"]._get_content(), dtype=np.int32).tolist() == [7]
    assert np.frombuffer(inputs["random_seed"]._get_content(), dtype=np.uint64).tolist() == [2**64 - 1]
    assert "héllo".encode() in inputs["text_input"]._get_content()


@pytest.mark.parametrize(("values", "says"), [
    ({"max_tokens": 10**12}, "max_tokens 1000000000000 is out of range (int32: -2147483648..2147483647)"),
    ({"max_tokens": -(2**31) - 1}, "max_tokens -2147483649 is out of range"),
    ({"random_seed": -1}, "random_seed -1 is out of range (uint64: 0..18446744073709551615)"),
    ({"text_input": "a\ud800b"}, "text_input is not valid text: surrogates not allowed (character 1)"),
    ({"stop_words": ["ok", "\udfff"]}, "stop_words is not valid text: surrogates not allowed (character 0)"),
])
def test_a_value_the_wire_cannot_carry_is_refused_naming_the_input(values, says):
    # numpy wraps 10**12 into an int32 (-727379968), which the server then reported as "must be > 0"
    with pytest.raises(ClientError) as e:
        grpc_inputs({"text_input": "hi", **values})
    assert says in e.value.message and "\n" not in e.value.message
    assert error_code(e.value) == "INVALID_ARG"  # the OpenAI endpoint answers it with a 400


def test_generate_params_within_range_pass():
    values = {"text_input": "hi", **GenerateParams(max_tokens=2**31 - 1, seed=2**64 - 1).fields()}
    assert {i.name() for i in grpc_inputs(values)} >= {"text_input", "max_tokens", "seed"}


@pytest.mark.parametrize(("params", "says"), [
    (GenerateParams(max_tokens=10**13), "max_tokens 10000000000000 is out of range"),  # Triton wrapped it: 1316134912
    (GenerateParams(seed=-1), "seed -1 is out of range (uint64"),  # Triton: "Unable to parse 'data': ..."
])
def test_http_generate_refuses_an_integer_out_of_range_before_connecting(params, says):
    with pytest.raises(ClientError) as e:
        generate_http(f"127.0.0.1:{free_port()}", "hi", params)  # nothing listens: the check comes first
    assert says in e.value.message and error_code(e.value) == "INVALID_ARG"
