"""Tool calling on /v1/chat/completions: the request's `tools` go to the model's chat template, its
`tool_choice` decides how calls come out, and the output becomes the message's `tool_calls`.

    tool_choice                 output                                      how it is read
    "none"                      free text                                   content only
    "auto" (default with tools) free text                                   the server's --tool-call-parser
                                                                            (router.tool_parsers): calls, or content
    "required"                  constrained: a JSON list of                 every element is a call
                                {"name": <a tool>, "parameters": <its schema>}
                                (one element when parallel_tool_calls is false)
    {"type": "function", ...}   constrained: that tool's parameters schema  the whole output is its arguments

The constrained forms are structured outputs (engine.structured_output), so their arguments always
validate against the tool's schema. `finish_reason` is "tool_calls" when calls were made (OpenAI gives
"stop" for a named function, and so does this).
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass

from router.api_models import ChatCompletionRequest
from router.errors import bad_request
from router.tool_parsers import PARSERS, Call

MODES = ("none", "auto", "required", "named")


@dataclass(frozen=True)
class ToolUse:
    """What one request's tools and tool_choice ask of the output."""

    tools: tuple[dict, ...]  # the request's tools, as the chat template takes them
    mode: str  # one of MODES
    name: str | None = None  # the function a named tool_choice forces
    parser: str | None = None  # auto: the --tool-call-parser
    parallel: bool = True  # False (parallel_tool_calls): at most one call

    @property
    def structured(self) -> tuple[str, str] | None:
        """The (kind, spec) that constrains the output ("required" and named), else None."""
        if self.mode == "named":
            return "json", json.dumps(_parameters(self._function(self.name)))
        if self.mode == "required":
            calls = [{"type": "object", "properties": {"name": {"enum": [f["name"]]}, "parameters": _parameters(f)},
                      "required": ["name", "parameters"], "additionalProperties": False}
                     for f in (t["function"] for t in self.tools)]  # fmt: skip
            one_or_more = {"minItems": 1} if self.parallel else {"minItems": 1, "maxItems": 1}
            return "json", json.dumps({"type": "array", **one_or_more, "items": {"anyOf": calls}})
        return None

    def calls_in(self, text: str) -> tuple[str | None, list[dict]]:
        """(content, tool_calls in OpenAI's shape) of a finished choice's text."""
        if self.mode == "named":
            return None, [_tool_call(self.name, text)]
        content, found = text, []
        if self.mode == "required":
            found = _required_calls(text)
            content = None if found else text
        elif self.mode == "auto":
            content, found = PARSERS[self.parser](text)
            found = found if self.parallel else found[:1]
        return content, [_tool_call(name, json.dumps(args, ensure_ascii=False)) for name, args in found]

    def _function(self, name: str) -> dict:
        return next(t["function"] for t in self.tools if t["function"]["name"] == name)


def tool_use_from(body: ChatCompletionRequest, parser: str | None) -> ToolUse | None:
    """The request's ToolUse (None without tools); 400 for malformed tools or a choice they cannot serve."""
    tools = tuple(_checked_tool(t, i) for i, t in enumerate(body.tools or ()))
    choice = body.tool_choice if body.tool_choice is not None else ("auto" if tools else "none")
    if not tools:
        if choice != "none":
            raise bad_request("tool_choice needs tools", "tool_choice")
        return None
    if isinstance(choice, dict):
        function = choice.get("function") if choice.get("type") == "function" else None
        name = function.get("name") if isinstance(function, dict) else None
        if not any(t["function"]["name"] == name for t in tools):
            raise bad_request(f"tool_choice names {name!r}, which is not among the tools", "tool_choice")
        return _constrained(body, ToolUse(tools, "named", name, parallel=body.parallel_tool_calls))
    if choice not in ("none", "auto", "required"):
        raise bad_request("tool_choice must be none, auto, required or a function", "tool_choice")
    if choice == "auto" and parser is None:
        raise bad_request("tool_choice auto needs the server started with --tool-call-parser "
                          f"({', '.join(PARSERS)}); use none, required or a named function", "tool_choice")  # fmt: skip
    use = ToolUse(tools, choice, parser=parser if choice == "auto" else None, parallel=body.parallel_tool_calls)
    return _constrained(body, use) if choice == "required" else use


def messages_for_template(messages: list[dict]) -> list[dict]:
    """The messages as chat templates expect them: an assistant's earlier tool calls with their arguments as
    objects (OpenAI sends them as JSON text; templates write them with `tojson`); 400 for calls that are not
    `{"function": {...}, ...}` objects."""
    return [_with_argument_objects(m, i) if m.get("tool_calls") else m for i, m in enumerate(messages)]


def _with_argument_objects(message: dict, index: int) -> dict:
    calls = message["tool_calls"]
    if not isinstance(calls, list) or not all(isinstance(c, dict) and isinstance(c.get("function", {}), dict)
                                              for c in calls):  # fmt: skip
        raise bad_request(f"messages[{index}].tool_calls must be a list of "
                          '{"type": "function", "function": {...}} objects', "messages")  # fmt: skip
    calls = [{**call, "function": _arguments_as_object(dict(call.get("function", {})))} for call in calls]
    return {**message, "tool_calls": calls}


def _arguments_as_object(function: dict) -> dict:
    if isinstance(function.get("arguments"), str):
        try:
            function["arguments"] = json.loads(function["arguments"])
        except (ValueError, RecursionError):
            pass  # not JSON (or nested past the parser): the template gets the text as it came
    return function


def _constrained(body: ChatCompletionRequest, use: ToolUse) -> ToolUse:
    if any(getattr(body, f) is not None for f in ("guided_json", "guided_regex", "guided_choice", "guided_grammar",
                                                  "structured_outputs")) or (
            body.response_format or {}).get("type", "text") != "text":  # fmt: skip
        raise bad_request("a required or named tool_choice constrains the output itself; drop the structured "
                          "output fields", "tool_choice")  # fmt: skip
    return use


def _checked_tool(tool, i: int) -> dict:
    function = tool.get("function") if isinstance(tool, dict) else None
    if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(function, dict):
        raise bad_request(f"tools[{i}] must be {{\"type\": \"function\", \"function\": {{...}}}}", "tools")
    if not isinstance(function.get("name"), str) or not function["name"]:
        raise bad_request(f"tools[{i}].function.name must be a non-empty string", "tools")
    if not isinstance(function.get("parameters", {}), dict):
        raise bad_request(f"tools[{i}].function.parameters must be a JSON schema object", "tools")
    return tool


def _parameters(function: dict) -> dict:
    return function.get("parameters") or {"type": "object", "properties": {}}


def _required_calls(text: str) -> list[Call]:
    try:
        value = json.loads(text)
    except ValueError:  # cut short (max_tokens): no call, the text is the content
        return []
    return [(c["name"], c["parameters"]) for c in value] if isinstance(value, list) else []


def new_call_id() -> str:
    """A tool call's id, in OpenAI's form."""
    return f"call_{uuid.uuid4().hex[:24]}"


def _tool_call(name: str, arguments: str) -> dict:
    return {"id": new_call_id(), "type": "function", "function": {"name": name, "arguments": arguments}}
