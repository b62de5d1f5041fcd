import dataclasses
import math

import pytest

from engine.sampling_params import SamplingParams


def test_defaults_match_vllm():
    p = SamplingParams()
    assert (p.n, p.temperature, p.top_p, p.top_k, p.min_p) == (1, 1.0, 1.0, 0, 0.0)
    assert p.seed is None
    assert (p.repetition_penalty, p.presence_penalty, p.frequency_penalty) == (1.0, 0.0, 0.0)
    assert (p.max_tokens, p.min_tokens) == (16, 0)
    assert p.stop == () and p.stop_token_ids == ()
    assert p.ignore_eos is False and p.logprobs is None
    assert p.include_stop_str_in_output is False and p.skip_special_tokens is True
    assert not p.is_greedy


def test_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        SamplingParams().temperature = 0.5  # type: ignore[misc]


@pytest.mark.parametrize("temperature, greedy", [(0.0, True), (0, True), (1e-6, True),
                                                 (1e-5, False), (0.7, False)])
def test_is_greedy(temperature, greedy):
    assert SamplingParams(temperature=temperature).is_greedy is greedy


def test_int_floats_are_stored_as_float():
    p = SamplingParams(temperature=1, top_p=1, repetition_penalty=2)
    assert type(p.temperature) is float and type(p.repetition_penalty) is float
    assert p == SamplingParams(temperature=1.0, repetition_penalty=2.0)


def test_stop_normalisation():
    assert SamplingParams(stop="###").stop == ("###",)
    assert SamplingParams(stop=["a", "bc"]).stop == ("a", "bc")
    assert SamplingParams(stop=None).stop == ()
    assert SamplingParams(stop_token_ids=[3, 4]).stop_token_ids == (3, 4)
    assert SamplingParams(stop_token_ids=7).stop_token_ids == (7,)
    assert SamplingParams(stop_token_ids=None).stop_token_ids == ()
    # Tuples make params hashable, so they can key caches.
    hash(SamplingParams(stop=["x"], stop_token_ids=[1]))


def test_valid_edge_values_accepted():
    SamplingParams(n=4, temperature=0.0, top_p=1.0, top_k=-1, min_p=1.0, seed=-5,
                   repetition_penalty=0.5, presence_penalty=-2.0, frequency_penalty=2.0,
                   max_tokens=1, min_tokens=1, logprobs=20, stop_token_ids=[0])
    SamplingParams(max_tokens=None, min_tokens=1000, logprobs=0, top_k=0, seed=2**64 - 1)


@pytest.mark.parametrize(
    "kwargs, field",
    [
        (dict(n=0), "n"),
        (dict(n=-1), "n"),
        (dict(temperature=-0.1), "temperature"),
        (dict(temperature=math.inf), "temperature"),
        (dict(temperature=math.nan), "temperature"),
        (dict(top_p=0.0), "top_p"),
        (dict(top_p=1.01), "top_p"),
        (dict(top_p=-0.5), "top_p"),
        (dict(top_p=math.nan), "top_p"),
        (dict(top_k=-2), "top_k"),
        (dict(min_p=-0.01), "min_p"),
        (dict(min_p=1.5), "min_p"),
        (dict(repetition_penalty=0.0), "repetition_penalty"),
        (dict(repetition_penalty=-1.0), "repetition_penalty"),
        (dict(presence_penalty=2.5), "presence_penalty"),
        (dict(presence_penalty=-2.01), "presence_penalty"),
        (dict(frequency_penalty=3.0), "frequency_penalty"),
        (dict(frequency_penalty=-2.5), "frequency_penalty"),
        (dict(max_tokens=0), "max_tokens"),
        (dict(max_tokens=-3), "max_tokens"),
        (dict(min_tokens=-1), "min_tokens"),
        (dict(min_tokens=17), "min_tokens"),  # default max_tokens is 16
        (dict(min_tokens=5, max_tokens=4), "min_tokens"),
        (dict(logprobs=-1), "logprobs"),
        (dict(logprobs=21), "logprobs"),
        (dict(seed=2**64), "seed"),
        (dict(stop=""), "stop"),
        (dict(stop=["ok", ""]), "stop"),
        (dict(stop_token_ids=[-1]), "stop_token_ids"),
        (dict(stop_token_ids=[1, 2.0]), "stop_token_ids"),
    ],
)
def test_invalid_values_raise(kwargs, field):
    with pytest.raises(ValueError, match=field) as info:
        SamplingParams(**kwargs)
    # The message names the offending value too.
    bad = next(iter(kwargs.values()))
    if field not in ("stop", "stop_token_ids"):
        assert repr(bad) in str(info.value) or repr(float(bad)) in str(info.value)


@pytest.mark.parametrize(
    "kwargs, field",
    [
        (dict(temperature="hot"), "temperature"),
        (dict(temperature=None), "temperature"),
        (dict(temperature=True), "temperature"),
        (dict(top_p="0.9"), "top_p"),
        (dict(min_p=[0.1]), "min_p"),
        (dict(repetition_penalty=None), "repetition_penalty"),
        (dict(presence_penalty="1"), "presence_penalty"),
        (dict(frequency_penalty=object()), "frequency_penalty"),
        (dict(n=1.5), "n"),
        (dict(n="2"), "n"),
        (dict(n=True), "n"),
        (dict(top_k=2.0), "top_k"),
        (dict(min_tokens=None), "min_tokens"),
        (dict(max_tokens=10.0), "max_tokens"),
        (dict(max_tokens="10"), "max_tokens"),
        (dict(logprobs=1.0), "logprobs"),
        (dict(logprobs=True), "logprobs"),
        (dict(seed="42"), "seed"),
        (dict(seed=1.0), "seed"),
        (dict(stop=5), "stop"),
        (dict(stop=[b"x"]), "stop"),
        (dict(stop_token_ids="12"), "stop_token_ids"),
        (dict(stop_token_ids=[True]), "stop_token_ids"),
        (dict(stop_token_ids=3.5), "stop_token_ids"),
        (dict(ignore_eos="yes"), "ignore_eos"),
        (dict(include_stop_str_in_output=1), "include_stop_str_in_output"),
        (dict(skip_special_tokens=None), "skip_special_tokens"),
    ],
)
def test_wrong_types_raise_value_error(kwargs, field):
    with pytest.raises(ValueError, match=field):
        SamplingParams(**kwargs)


def test_logit_bias_is_stored_as_sorted_pairs_and_checked():
    assert SamplingParams(logit_bias={9: 1, 2: -3.5}).logit_bias == ((2, -3.5), (9, 1.0))
    assert SamplingParams(logit_bias=[(4, 2.0)]).logit_bias == ((4, 2.0),)
    for bad in ({-1: 1.0}, {"3": 1.0}, {3: 101.0}, {3: float("nan")}, "x"):
        with pytest.raises(ValueError, match="logit_bias"):
            SamplingParams(logit_bias=bad)


def test_no_stop_before_min_tokens_then_eos_unless_ignored_then_stop_ids():
    eos = {2}
    p = SamplingParams(min_tokens=2, stop_token_ids=[9])
    assert p.stop_by(2, 1, eos) is None and p.stop_by(9, 1, eos) is None  # min_tokens not reached
    assert p.stop_by(2, 2, eos) == "eos" and p.stop_by(9, 2, eos) == 9 and p.stop_by(5, 2, eos) is None
    assert SamplingParams(ignore_eos=True).stop_by(2, 1, eos) is None
