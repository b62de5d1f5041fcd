"""Which (kind, spec) each structured-output field asks for, and the 400s for malformed or doubled asks."""

from __future__ import annotations

import json

import pytest

from router.api_models import ChatCompletionRequest, CompletionRequest
from router.errors import APIError
from router.structured_request import structured_from

SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}


def _completion(**fields) -> CompletionRequest:
    return CompletionRequest(model="m", prompt="hi", **fields)


@pytest.mark.parametrize("fields,expected", [
    ({}, None),
    ({"response_format": {"type": "text"}}, None),
    ({"response_format": {"type": "json_object"}}, ("json_object", "")),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": SCHEMA, "strict": True}}},
     ("json", json.dumps(SCHEMA))),
    ({"guided_json": SCHEMA}, ("json", json.dumps(SCHEMA))),
    ({"guided_json": json.dumps(SCHEMA)}, ("json", json.dumps(SCHEMA))),
    ({"guided_regex": "[a-c]+"}, ("regex", "[a-c]+")),
    ({"guided_choice": ["yes", "no"]}, ("choice", '["yes", "no"]')),
    ({"guided_grammar": 'root ::= "a"'}, ("grammar", 'root ::= "a"')),
    ({"structured_outputs": {"choice": ["x", "y"]}}, ("choice", '["x", "y"]')),
    ({"structured_outputs": {"json_object": True}}, ("json_object", "")),
    ({"structured_outputs": {"regex": "a+", "json": None, "json_object": False}}, ("regex", "a+")),
])  # fmt: skip
def test_each_field_asks_for_its_kind(fields, expected):
    assert structured_from(_completion(**fields)) == expected
    chat = ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "hi"}], **fields)
    assert structured_from(chat) == expected


@pytest.mark.parametrize("fields,param,words", [
    ({"response_format": {"type": "json_schema"}}, "response_format", "json_schema"),
    ({"response_format": {"type": "yaml"}}, "response_format", "json_object or json_schema"),
    ({"response_format": {"type": "json_schema", "json_schema": {"schema": "{not json"}}},
     "response_format.json_schema.schema", "not valid JSON"),
    ({"guided_json": [1, 2]}, "guided_json", "JSON schema object"),
    ({"guided_json": "[" * 10_000}, "guided_json", "nested deeper than 128 levels"),
    ({"guided_json": "[" * 100_000}, "guided_json", "at most 65536"),  # refused before it is parsed
    ({"guided_regex": "a" * 65_537}, "guided_regex", "at most 65536"),
    ({"guided_choice": ["x" * 1000] * 100}, "guided_choice", "at most 65536"),
    ({"guided_json": '{"a": ' * 129 + "1" + "}" * 129}, "guided_json", "nested deeper than 128 levels"),
    ({"guided_choice": []}, "guided_choice", "non-empty list"),
    ({"guided_choice": ["a", 3]}, "guided_choice", "non-empty list"),
    ({"guided_regex": ""}, "guided_regex", "non-empty string"),
    ({"structured_outputs": {"structural_tag": "x"}}, "structured_outputs", "structural_tag is not supported"),
    ({"structured_outputs": {"regex": "a", "choice": ["b"]}}, "structured_outputs", "exactly one"),
    ({"guided_regex": "a", "response_format": {"type": "json_object"}}, "guided_regex",
     "only one structured output may be asked for, got response_format, guided_regex"),
])  # fmt: skip
def test_malformed_or_doubled_asks_are_a_400_naming_the_field(fields, param, words):
    with pytest.raises(APIError) as refused:
        structured_from(_completion(**fields))
    assert refused.value.status == 400 and refused.value.param == param
    assert words in refused.value.message
