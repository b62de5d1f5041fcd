"""Tool calls in a model's free text (`tool_choice: "auto"`), one parser per model family, named as vLLM's
`--tool-call-parser` names them:

    hermes       <tool_call>{"name": ..., "arguments": {...}}</tool_call>, one block per call (Hermes,
                 Qwen 2.5 and later, many fine-tunes); text before the first block is the message content
    llama3_json  the whole output is {"name": ..., "parameters": {...}} (Llama 3.1+ JSON tool calling),
                 optionally after <|python_tag|>, several calls separated by ";"

A parser returns (content, calls): calls as (name, arguments object) pairs; text that holds no well-formed
call is all content and no call.
"""

from __future__ import annotations

import json
from typing import Callable

Call = tuple[str, dict]
Parsed = tuple[str | None, list[Call]]

HERMES_OPEN, HERMES_CLOSE = "<tool_call>", "</tool_call>"


def parse_hermes(text: str) -> Parsed:
    start = text.find(HERMES_OPEN)
    if start < 0:
        return text, []
    calls = [call for block in _hermes_blocks(text, start) if (call := _call(block, ("arguments",)))]
    if not calls:
        return text, []
    content = text[:start].strip()
    return content or None, calls


def _hermes_blocks(text: str, start: int) -> list[str]:
    """Each block's text from `<tool_call>` to its `</tool_call>` (the last may be cut short by the end), by
    plain search: linear in the text (a regex with lazy and greedy runs around the block was quadratic in
    whitespace: 156 ms for 4,000 spaces, on the router's event loop)."""
    blocks = []
    while start >= 0:
        body = start + len(HERMES_OPEN)
        end = text.find(HERMES_CLOSE, body)
        blocks.append(text[body:end if end >= 0 else len(text)].strip())
        start = text.find(HERMES_OPEN, end + len(HERMES_CLOSE)) if end >= 0 else -1
    return blocks


def parse_llama3_json(text: str) -> Parsed:
    body = text.strip().removeprefix("<|python_tag|>").strip()
    if not body.startswith("{"):
        return text, []
    calls = []
    for piece in _json_objects(body):
        call = _call(piece, ("parameters", "arguments"))
        if call is None:
            return text, []
        calls.append(call)
    return (None, calls) if calls else (text, [])


def _call(text: str, argument_keys: tuple[str, ...]) -> Call | None:
    """(name, arguments) of a JSON call object, its arguments under the first of `argument_keys` it has."""
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):  # not JSON, or nested past the parser: not a call
        return None
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return None
    arguments = next((value[key] for key in argument_keys if key in value), {})
    return (value["name"], arguments) if isinstance(arguments, dict) else None


def _json_objects(text: str) -> list[str]:
    """The JSON objects of `text`, separated by ";" (and whitespace); [] if anything else is between them."""
    decoder, pieces, at = json.JSONDecoder(), [], 0
    while at < len(text):
        try:
            _, end = decoder.raw_decode(text, at)
        except ValueError:
            return []
        pieces.append(text[at:end])
        at = end
        while at < len(text) and text[at] in "; \t\n":
            at += 1
    return pieces


PARSERS: dict[str, Callable[[str], Parsed]] = {"hermes": parse_hermes, "llama3_json": parse_llama3_json}
