"""Structured outputs end to end: the official `openai` client -> router -> prefill + decode actors on Ray.

The prefill worker samples the first token under the grammar's mask and the decode worker continues the
grammar from it; the output equals the colocated engine's (one engine prefills and decodes) token for
token.
"""

from __future__ import annotations

import json
import re
import types
from typing import Literal

import openai
import pytest
from pydantic import BaseModel

from engine import LLM, EngineArgs, SamplingParams
from router.config import RouterConfig
from tests.e2e.router_cluster import CHAT_TEMPLATE, router_on_ray
from tests.e2e.test_router_openai import _wait_all_free

MODEL = "tiny-llama"


class Verdict(BaseModel):
    answer: Literal["yes", "no"]
    sure: bool


@pytest.fixture(scope="module")
def served(ray_session, tiny_model_dirs):
    model_dir = tiny_model_dirs["llama"]
    args = EngineArgs(model=model_dir, num_kv_blocks=48, max_model_len=256, dtype="float32")
    config = RouterConfig(model_dir, MODEL, max_model_len=256, chat_template=CHAT_TEMPLATE)
    with router_on_ray(ray_session, args, config) as stack:
        client = openai.OpenAI(base_url=f"{stack.server.url}/v1", api_key="unused", max_retries=0, timeout=60)
        yield types.SimpleNamespace(client=client, actors=stack.actors, model_dir=model_dir)


def test_parse_returns_the_pydantic_object(served):
    completion = served.client.beta.chat.completions.parse(
        model=MODEL, messages=[{"role": "user", "content": "Is water wet?"}], response_format=Verdict,
        temperature=0, max_tokens=64)  # fmt: skip
    message = completion.choices[0].message
    assert isinstance(message.parsed, Verdict) and completion.choices[0].finish_reason == "stop"
    assert Verdict.model_validate_json(message.content) == message.parsed


def test_json_object_output_parses(served):
    out = served.client.completions.create(model=MODEL, prompt=[9, 8, 7, 6], temperature=0, max_tokens=64,
                                           extra_body={"response_format": {"type": "json_object"}})  # fmt: skip
    assert isinstance(json.loads(out.choices[0].text), dict) and out.choices[0].finish_reason == "stop"


def test_vllm_fields_constrain_and_streaming_assembles_the_same_text(served):
    asks = [({"guided_choice": ["red", "green", "blue"]}, lambda t: t in ("red", "green", "blue")),
            ({"structured_outputs": {"regex": "[a-c]{3}-[0-9]"}}, lambda t: re.fullmatch("[a-c]{3}-[0-9]", t)),
            ({"guided_json": Verdict.model_json_schema()}, lambda t: Verdict.model_validate_json(t))]  # fmt: skip
    for extra, holds in asks:
        whole = served.client.completions.create(model=MODEL, prompt=[5, 17, 42], temperature=0, max_tokens=64,
                                                 extra_body=extra)  # fmt: skip
        assert holds(whole.choices[0].text) and whole.choices[0].finish_reason == "stop", whole.choices[0].text
        chunks = served.client.completions.create(model=MODEL, prompt=[5, 17, 42], temperature=0, max_tokens=64,
                                                  extra_body=extra, stream=True)  # fmt: skip
        assert "".join(c.choices[0].text for c in chunks if c.choices) == whole.choices[0].text


def test_greedy_output_equals_the_colocated_engines(served):
    schema = json.dumps(Verdict.model_json_schema())
    llm = LLM(model=served.model_dir, dtype="float32", max_model_len=256, num_kv_blocks=32)
    for prompt in ([5, 17, 42], [3, 1, 4, 1, 5, 9, 2, 6]):
        expected = llm.generate([{"prompt_token_ids": prompt}], SamplingParams(
            temperature=0, max_tokens=64, structured=("json", schema)), use_tqdm=False)[0].outputs[0].text
        got = served.client.completions.create(model=MODEL, prompt=prompt, temperature=0, max_tokens=64,
                                               extra_body={"guided_json": schema})  # fmt: skip
        assert got.choices[0].text == expected


def test_invalid_or_doubled_asks_are_a_400_and_leak_nothing(served):
    bad = [({"guided_regex": "a(b"}, "Regex parsing error"),
           ({"guided_json": {"type": "object", "properties": 3}}, "properties must be an object"),
           ({"guided_regex": "a", "guided_choice": ["b"]}, "only one structured output"),
           ({"response_format": {"type": "json_schema"}}, "json_schema")]  # fmt: skip
    for extra, words in bad:
        with pytest.raises(openai.BadRequestError, match=re.escape(words)):
            served.client.completions.create(model=MODEL, prompt=[5, 17], max_tokens=4, extra_body=extra)
    _wait_all_free(served)
