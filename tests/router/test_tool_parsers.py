"""The tool-call parsers read calls out of model text the way each model family writes them, and leave
anything that is not a well-formed call as content."""

from __future__ import annotations

from router.tool_parsers import parse_hermes, parse_llama3_json


def test_hermes_blocks_become_calls_and_text_before_them_content():
    text = ('Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
            '<tool_call>{"name": "get_time", "arguments": {}}</tool_call>')  # fmt: skip
    assert parse_hermes(text) == ("Let me check.", [("get_weather", {"city": "Paris"}), ("get_time", {})])
    # The last block may be cut before its closing tag (a stop string, max_tokens after the JSON).
    assert parse_hermes('<tool_call>{"name": "f", "arguments": {"a": 1}}') == (None, [("f", {"a": 1})])


def test_hermes_without_a_well_formed_call_is_content():
    for text in ("just words", '<tool_call>{"name": "f", "argu', '<tool_call>{"arguments": {}}</tool_call>',
                 '<tool_call>{"name": "f", "arguments": [1]}</tool_call>'):  # fmt: skip
        assert parse_hermes(text) == (text, [])


def test_llama3_json_calls_with_or_without_the_python_tag_and_separated_by_semicolons():
    assert parse_llama3_json('{"name": "f", "parameters": {"x": 1}}') == (None, [("f", {"x": 1})])
    text = '<|python_tag|>{"name": "f", "parameters": {}}; {"name": "g", "arguments": {"y": "z"}}'
    assert parse_llama3_json(text) == (None, [("f", {}), ("g", {"y": "z"})])


def test_llama3_json_that_is_not_only_calls_is_content():
    for text in ("The answer is 4.", '{"name": "f", "parameters": {}} and then some words', '{"not": "a call"}',
                 '{"name": "f", "parameters": {'):  # fmt: skip
        assert parse_llama3_json(text) == (text, [])


def test_hermes_reads_hostile_output_as_content_in_one_pass():
    # Whitespace after the tag was quadratic for the old regex (4,000 spaces: 156 ms on the event loop), and
    # brackets nested past Python's JSON parser were a RecursionError (a 500): both are content now.
    for text in ("<tool_call>" + " " * 200_000 + "x", "<tool_call>" + "[" * 100_000):
        assert parse_hermes(text) == (text, [])
    spaced = "<tool_call>" + " " * 50_000 + '{"name": "f", "arguments": {}}' + " " * 50_000 + "</tool_call>"
    assert parse_hermes(spaced) == (None, [("f", {})])
