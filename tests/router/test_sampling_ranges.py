"""The sampling parameters' ranges, written once (wire.sampling_rules): a 400 naming the field as the client
named it, a SamplingSpec that refuses to exist out of range, and the engine's params by the same rules."""

from __future__ import annotations

import pytest

from engine.sampling_params import SamplingParams
from router.api_models import ChatCompletionRequest, CompletionRequest
from router.errors import APIError
from router.openai_common import sampling_from
from wire.codec import DecodeError, decode, encode
from wire.requests import SamplingSpec
from wire.sampling_rules import SamplingOutOfRange

VOCAB = 100


@pytest.mark.parametrize("fields,param", [
    ({"temperature": -0.5}, "temperature"), ({"top_p": 0.0}, "top_p"), ({"top_k": -2}, "top_k"),
    ({"min_p": 1.5}, "min_p"), ({"repetition_penalty": 0.0}, "repetition_penalty"),
    ({"presence_penalty": 2.5}, "presence_penalty"), ({"frequency_penalty": -3}, "frequency_penalty"),
    ({"seed": 2**64}, "seed"), ({"min_tokens": -1}, "min_tokens"), ({"min_tokens": 9}, "min_tokens"),
])  # fmt: skip
def test_a_value_out_of_range_is_a_400_naming_its_field_and_the_engine_refuses_it_too(fields, param):
    with pytest.raises(APIError) as refused:
        sampling_from(CompletionRequest(model="m", prompt="hi", **fields), VOCAB, max_tokens=8, logprobs=None)
    assert refused.value.status == 400 and refused.value.param == param
    with pytest.raises(ValueError, match=param):
        SamplingParams(max_tokens=8, **fields)


def test_chat_names_the_fields_as_its_client_did():
    chat = ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "hi"}], top_logprobs=21)
    with pytest.raises(APIError) as refused:
        sampling_from(chat, VOCAB, 8, logprobs=21, names={"logprobs": "top_logprobs"})
    assert refused.value.param == "top_logprobs" and "top_logprobs must be in [0, 20]" in refused.value.message


def test_a_spec_out_of_range_is_never_made_nor_decoded():
    with pytest.raises(SamplingOutOfRange):
        SamplingSpec(temperature=-1.0)
    good = encode(SamplingSpec(top_p=0.5))
    wire_form = good.replace(b"\xcb\x3f\xe0" + b"\x00" * 6, b"\xcb\xbf\xf0" + b"\x00" * 6)  # float64 0.5 -> -1.0
    assert wire_form != good
    with pytest.raises(DecodeError):  # top_p -1.0 on the wire: refused where it arrives
        decode(wire_form, SamplingSpec)
    assert sampling_from(CompletionRequest(model="m", prompt="hi"), VOCAB, 8, None).max_tokens == 8
