"""Tool calling end to end: the official `openai` client -> router -> prefill + decode actors on Ray.

A named or `required` tool_choice constrains the output to the tools' schemas, so the arguments always
validate; `auto` reads calls with the server's --tool-call-parser (hermes here; the output is steered into
a call with a vLLM structured-output field, since a random tiny model would never make one). Streamed
calls assemble, as the client's accumulation does, to the same calls.
"""

from __future__ import annotations

import json
import types
from typing import Literal

import openai
import pytest
from pydantic import BaseModel

from engine import EngineArgs
from router.config import RouterConfig
from tests.e2e.router_cluster import router_on_ray
from tests.e2e.test_router_openai import _wait_all_free

MODEL = "tiny-llama"
# The tools go into the prompt (the template writes them), and earlier calls and results too.
TEMPLATE = (
    "{% if tools %}<s>tools\n{% for t in tools %}{{ t.function.name }}({{ t.function.parameters.required | join(', ') }}) "
    "{% endfor %}</s>\n{% endif %}"
    "{% for m in messages %}<s>{{ m['role'] }}\n{{ m['content'] or '' }}"
    "{% for c in m.get('tool_calls') or [] %}<call>{{ c.function.arguments | tojson }}{% endfor %}</s>\n{% endfor %}"
    "{% if add_generation_prompt %}<s>assistant\n{% endif %}"
)


class Weather(BaseModel):
    city: Literal["Paris", "Oslo"]
    unit: Literal["c", "f"]


class Time(BaseModel):
    zone: Literal["utc", "cet"]


TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                           "parameters": Weather.model_json_schema()}},
         {"type": "function", "function": {"name": "get_time", "parameters": Time.model_json_schema()}}]  # fmt: skip
SCHEMAS = {"get_weather": Weather, "get_time": Time}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def served(ray_session, tiny_model_dirs):
    model_dir = tiny_model_dirs["llama"]
    args = EngineArgs(model=model_dir, num_kv_blocks=48, max_model_len=256, dtype="float32")
    config = RouterConfig(model_dir, MODEL, max_model_len=256, chat_template=TEMPLATE, tool_call_parser="hermes")
    with router_on_ray(ray_session, args, config) as stack:
        client = openai.OpenAI(base_url=f"{stack.server.url}/v1", api_key="unused", max_retries=0, timeout=60)
        yield types.SimpleNamespace(client=client, actors=stack.actors)


def _create(served, **fields):
    fields = {"temperature": 0, "max_tokens": 128, **fields}
    return served.client.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, **fields)


def _assembled(chunks) -> tuple[list[dict], str | None]:
    """Tool calls from stream deltas, accumulated as the client's helpers do: by index, arguments appended."""
    calls, finish = {}, None
    for chunk in chunks:
        for choice in chunk.choices:
            finish = choice.finish_reason or finish
            for delta in choice.delta.tool_calls or []:
                call = calls.setdefault(delta.index, {"id": None, "name": None, "arguments": ""})
                call["id"] = delta.id or call["id"]
                call["name"] = (delta.function.name if delta.function else None) or call["name"]
                call["arguments"] += (delta.function.arguments if delta.function else None) or ""
    return [calls[i] for i in sorted(calls)], finish


def test_the_tools_reach_the_chat_template(served):
    with_tools = _create(served, tool_choice="none", max_tokens=1)
    without = served.client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=1)
    assert with_tools.usage.prompt_tokens > without.usage.prompt_tokens + 10
    assert with_tools.choices[0].message.tool_calls in (None, [])


def test_a_named_choice_calls_it_with_arguments_that_validate(served):
    out = _create(served, tool_choice={"type": "function", "function": {"name": "get_weather"}})
    call, = out.choices[0].message.tool_calls  # fmt: skip
    assert call.type == "function" and call.function.name == "get_weather" and call.id.startswith("call_")
    Weather.model_validate_json(call.function.arguments)
    assert out.choices[0].finish_reason == "stop" and out.choices[0].message.content is None
    streamed, finish = _assembled(_create(served, tool_choice={"type": "function", "function": {"name": "get_weather"}},
                                          stream=True))  # fmt: skip
    assert [(c["name"], c["arguments"]) for c in streamed] == [("get_weather", call.function.arguments)]
    assert streamed[0]["id"].startswith("call_") and finish == "stop"


def test_required_makes_calls_that_validate_and_stream_the_same(served):
    # One call (parallel_tool_calls false): a random model left free to add calls never stops adding them.
    out = _create(served, tool_choice="required", parallel_tool_calls=False)
    calls = out.choices[0].message.tool_calls
    assert len(calls) == 1 and out.choices[0].finish_reason == "tool_calls"
    for call in calls:
        SCHEMAS[call.function.name].model_validate_json(call.function.arguments)
    streamed, finish = _assembled(_create(served, tool_choice="required", parallel_tool_calls=False, stream=True))
    assert [(c["name"], json.loads(c["arguments"])) for c in streamed] == \
        [(c.function.name, json.loads(c.function.arguments)) for c in calls]  # fmt: skip
    assert finish == "tool_calls"


def test_auto_reads_calls_with_the_parser_and_plain_text_stays_content(served):
    made = '<tool_call>{"name": "get_time", "arguments": {"zone": "cet"}}</tool_call>'
    out = _create(served, extra_body={"guided_choice": [made]})  # tool_choice defaults to auto with tools
    call, = out.choices[0].message.tool_calls  # fmt: skip
    assert (call.function.name, json.loads(call.function.arguments)) == ("get_time", {"zone": "cet"})
    assert out.choices[0].finish_reason == "tool_calls"
    streamed, finish = _assembled(_create(served, extra_body={"guided_choice": [made]}, stream=True))
    assert [(c["name"], json.loads(c["arguments"])) for c in streamed] == [("get_time", {"zone": "cet"})]
    plain = _create(served, extra_body={"guided_choice": ["no tools needed"]})
    assert plain.choices[0].message.content == "no tools needed" and not plain.choices[0].message.tool_calls
    assert plain.choices[0].finish_reason == "stop"


def test_a_conversation_with_earlier_calls_and_results_is_served(served):
    messages = ASK + [
        {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function", "function": {
            "name": "get_weather", "arguments": '{"city": "Paris", "unit": "c"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "21 degrees"}]  # fmt: skip
    # ignore_eos: the random model may draw its end-of-sequence token at once (a flaky 'stop').
    out = served.client.chat.completions.create(model=MODEL, messages=messages, tools=TOOLS, tool_choice="none",
                                                max_tokens=2, extra_body={"ignore_eos": True})  # fmt: skip
    assert out.choices[0].finish_reason == "length" and out.usage.completion_tokens == 2


def test_bad_tools_and_choices_are_a_400(served):
    bad = [dict(tool_choice={"type": "function", "function": {"name": "nope"}}),
           dict(tools=[{"type": "function", "function": {"parameters": {}}}]),
           dict(tool_choice="sometimes"),
           dict(tool_choice="required", response_format={"type": "json_object"})]  # fmt: skip
    for fields in bad:
        args = {"tools": TOOLS, **fields}
        with pytest.raises(openai.BadRequestError) as refused:
            served.client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=2, **args)
        assert refused.value.body["param"] in ("tools", "tool_choice")
    with pytest.raises(openai.BadRequestError, match="tool_choice needs tools"):
        served.client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=2, tool_choice="required")
    with pytest.raises(openai.BadRequestError, match="tools"):
        served.client.completions.create(model=MODEL, prompt="hi", max_tokens=2, extra_body={"tools": TOOLS})
    _wait_all_free(served)
