"""The continuation rules, written once: a request's sampling after n tokens, and a delta shifted past them."""

from __future__ import annotations

from engine.sampling_params import SamplingParams
from wire.requests import SamplingSpec, TokenDelta, TokenLogprob, continued


def test_a_continued_request_may_make_only_what_is_left_and_counts_the_tokens_as_earlier_output():
    spec = SamplingSpec(max_tokens=10, min_tokens=4, resumed_output_tokens=2)
    after = spec.continued(3)
    assert (after.max_tokens, after.min_tokens, after.resumed_output_tokens) == (7, 1, 5)
    assert spec.continued(6).min_tokens == 0
    assert spec.continued(10) is None and spec.continued(12) is None
    assert SamplingSpec(max_tokens=None).continued(100).max_tokens is None  # up to the model's length


def test_the_engines_params_continue_by_the_same_rule():
    params = continued(SamplingParams(max_tokens=5, min_tokens=2, temperature=0.0), 1)
    assert isinstance(params, SamplingParams)
    assert (params.max_tokens, params.min_tokens, params.resumed_output_tokens, params.temperature) == (4, 1, 1, 0.0)


def test_a_shifted_delta_is_numbered_as_the_whole_request_and_drops_the_prompt_logprobs():
    delta = TokenDelta("r", 2, (7, 8), True, "length", num_prompt_tokens=13, num_output_tokens=4, num_cached_tokens=12,
                       prompt_logprobs=(None, TokenLogprob(-0.5, (), 1)))  # fmt: skip
    whole = delta.shifted(3)
    assert (whole.first_index, whole.num_prompt_tokens, whole.num_output_tokens) == (5, 10, 7)
    assert whole.num_cached_tokens == 10 and whole.prompt_logprobs == ()  # cached: never beyond the prompt
    assert delta.shifted(0) is delta

