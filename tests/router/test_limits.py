"""Each bound of router.limits is a 400 naming its field, at the bound plus one and not at the bound."""

from __future__ import annotations

import pytest

from router.api_models import CompletionRequest
from router.errors import APIError
from router.limits import RequestLimits, check_limits

LIMITS = RequestLimits()


def _body(**fields) -> CompletionRequest:
    return CompletionRequest(model="m", prompt="hi", **fields)


@pytest.mark.parametrize("fields,prompts,param", [
    ({"stop": ["a"] * 5}, 1, "stop"),
    ({"stop": ["a" * 1025]}, 1, "stop"),
    ({"stop_token_ids": list(range(129))}, 1, "stop_token_ids"),
    ({"logit_bias": {str(i): 1.0 for i in range(1025)}}, 1, "logit_bias"),
    ({}, 1025, "prompt"),
    ({"n": 3}, 100, "n"),
])  # fmt: skip
def test_one_past_a_bound_is_a_400_naming_the_field(fields, prompts, param):
    with pytest.raises(APIError) as refused:
        check_limits(_body(**fields), LIMITS, prompts)
    assert refused.value.status == 400 and refused.value.param == param


def test_at_the_bounds_nothing_is_refused():
    body = _body(stop=["a" * 1024] * 4, stop_token_ids=list(range(128)), logit_bias={str(i): 1.0 for i in range(1024)},
                 n=2)  # fmt: skip
    check_limits(body, LIMITS, 128)
    check_limits(_body(stop="just one"), LIMITS, 256)
