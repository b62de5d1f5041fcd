"""The wire form of sampling parameters mirrors engine.SamplingParams field for field, less what shapes only text."""

from __future__ import annotations

import dataclasses

import pytest

from engine import SamplingParams
from output_text import TextOptions
from wire.codec import decode, encode
from runtime.engine_bridge import TEXT_ONLY_FIELDS, sampling_params, sampling_spec
from wire.requests import SamplingSpec


def test_sampling_spec_has_every_field_but_n_and_the_text_ones():
    # wire cannot import the engine (the router reads it), so the two lists are kept in step here.
    engine_fields = {f.name for f in dataclasses.fields(SamplingParams)} - {"n", *TEXT_ONLY_FIELDS}
    assert {f.name for f in dataclasses.fields(SamplingSpec)} == engine_fields
    # What the wire leaves out is what the text's owner takes (with min_tokens, which both need).
    assert {f.name for f in dataclasses.fields(TextOptions)} == {*TEXT_ONLY_FIELDS, "min_tokens"}


def test_sampling_params_round_trip_over_the_wire():
    params = SamplingParams(temperature=0.7, top_p=0.9, top_k=5, seed=3, max_tokens=9, min_tokens=2,
                            stop_token_ids=(7,), logprobs=2, ignore_eos=True)  # fmt: skip
    assert sampling_params(decode(encode(sampling_spec(params)), SamplingSpec)) == params


def test_bad_values_and_n_are_refused():
    with pytest.raises(ValueError, match="fan n=2 out"):
        sampling_spec(SamplingParams(n=2))
    with pytest.raises(ValueError, match="stop, skip_special_tokens shape text"):
        sampling_spec(SamplingParams(stop=["\n"], skip_special_tokens=False))
    with pytest.raises(ValueError, match="temperature"):
        sampling_params(SamplingSpec(temperature=-1.0))
