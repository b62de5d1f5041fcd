"""The wire form of sampling parameters mirrors engine.SamplingParams field for field."""

from __future__ import annotations

import dataclasses

import pytest

from engine import SamplingParams
from wire.codec import decode, encode
from runtime.engine_bridge import sampling_params, sampling_spec
from wire.requests import SamplingSpec


def test_sampling_spec_has_every_field_but_n():
    # protocol.py cannot import the engine (the router reads it), so the two lists are kept in step here.
    engine_fields = {f.name for f in dataclasses.fields(SamplingParams)} - {"n"}
    assert {f.name for f in dataclasses.fields(SamplingSpec)} == engine_fields


def test_sampling_params_round_trip_over_the_wire():
    params = SamplingParams(temperature=0.7, top_p=0.9, top_k=5, seed=3, max_tokens=9, min_tokens=2,
                            stop=("\n",), stop_token_ids=(7,), logprobs=2, ignore_eos=True)  # fmt: skip
    assert sampling_params(decode(encode(sampling_spec(params)), SamplingSpec)) == params


def test_bad_values_and_n_are_refused():
    with pytest.raises(ValueError, match="fan n=2 out"):
        sampling_spec(SamplingParams(n=2))
    with pytest.raises(ValueError, match="temperature"):
        sampling_params(SamplingSpec(temperature=-1.0))
