"""What a request's tools and tool_choice ask for (router.tool_calls): a constraint, a parser, or nothing;
the constraint's schema is one xgrammar compiles; a finished choice's text becomes content or calls."""

from __future__ import annotations

import json

import pytest

from engine.structured_output import grammar_of
from router.api_models import ChatCompletionRequest
from router.errors import APIError
from router.tool_calls import messages_for_template, tool_use_from

TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {
    "a": {"type": "integer"}}, "required": ["a"]}}}, {"type": "function", "function": {"name": "g"}}]  # fmt: skip


def _body(**fields) -> ChatCompletionRequest:
    return ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "hi"}], **fields)


def test_each_choice_is_a_mode_and_the_constrained_ones_a_schema_xgrammar_takes():
    assert tool_use_from(_body(), None) is None
    assert tool_use_from(_body(tools=TOOLS, tool_choice="none"), None).structured is None
    auto = tool_use_from(_body(tools=TOOLS), "hermes")  # tools without tool_choice: auto
    assert (auto.mode, auto.parser, auto.structured) == ("auto", "hermes", None)
    named = tool_use_from(_body(tools=TOOLS, tool_choice={"type": "function", "function": {"name": "f"}}), None)
    assert named.structured == ("json", json.dumps(TOOLS[0]["function"]["parameters"]))
    required = tool_use_from(_body(tools=TOOLS, tool_choice="required", parallel_tool_calls=False), None)
    schema = json.loads(required.structured[1])
    assert (schema["type"], schema["maxItems"], len(schema["items"]["anyOf"])) == ("array", 1, 2)
    for use in (named, required):
        assert grammar_of(*use.structured) is not None


def test_finished_text_becomes_content_or_calls():
    named = tool_use_from(_body(tools=TOOLS, tool_choice={"type": "function", "function": {"name": "f"}}), None)
    content, (call,) = named.calls_in('{"a": 3}')
    assert content is None and call["function"] == {"name": "f", "arguments": '{"a": 3}'}
    required = tool_use_from(_body(tools=TOOLS, tool_choice="required"), None)
    _, calls = required.calls_in('[{"name": "g", "parameters": {}}, {"name": "f", "parameters": {"a": 1}}]')
    assert [c["function"]["name"] for c in calls] == ["g", "f"] and len({c["id"] for c in calls}) == 2
    assert required.calls_in('[{"name": "g", "par') == ('[{"name": "g", "par', [])  # cut short: content
    single = tool_use_from(_body(tools=TOOLS, parallel_tool_calls=False), "hermes")
    two = '<tool_call>{"name": "f", "arguments": {"a": 1}}</tool_call><tool_call>{"name": "g", "arguments": {}}'
    assert [c["function"]["name"] for c in single.calls_in(two)[1]] == ["f"]


@pytest.mark.parametrize("fields,parser,words", [
    ({"tools": TOOLS}, None, "--tool-call-parser"),
    ({"tool_choice": "required"}, None, "tool_choice needs tools"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "h"}}}, None, "not among the tools"),
    ({"tools": [{"type": "function", "function": {"name": ""}}], "tool_choice": "none"}, None, "name"),
    ({"tools": [{"type": "retrieval"}], "tool_choice": "none"}, None, "tools[0]"),
    ({"tools": TOOLS, "tool_choice": "required", "guided_regex": "a"}, None, "constrains the output itself"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": "f"}}, None, "not among the tools"),
])  # fmt: skip
def test_bad_tools_and_choices_are_a_400(fields, parser, words):
    with pytest.raises(APIError) as refused:
        tool_use_from(_body(**fields), parser)
    assert refused.value.status == 400 and words in refused.value.message


def test_earlier_calls_reach_the_template_with_argument_objects():
    messages = [{"role": "assistant", "tool_calls": [{"id": "c", "type": "function",
                                                      "function": {"name": "f", "arguments": '{"a": 1}'}}]},
                {"role": "tool", "content": "2"}]  # fmt: skip
    out = messages_for_template(messages)
    assert out[0]["tool_calls"][0]["function"]["arguments"] == {"a": 1} and out[1] == messages[1]
    assert messages[0]["tool_calls"][0]["function"]["arguments"] == '{"a": 1}'  # the request's own untouched


@pytest.mark.parametrize("tool_calls", [[1], "f", [{"function": "f"}], [{"function": [1]}]])
def test_earlier_calls_that_are_not_call_objects_are_a_400(tool_calls):
    with pytest.raises(APIError) as refused:
        messages_for_template([{"role": "user", "content": "hi"}, {"role": "assistant", "tool_calls": tool_calls}])
    assert refused.value.status == 400 and "messages[1].tool_calls" in refused.value.message
