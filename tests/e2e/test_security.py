"""A served cluster with every guard on (API key, cluster key, body limit): hostile traffic on its
internal sockets is refused and counted, and it still answers like transformers; a flood of 500
concurrent streams against its 1 prefill + 1 decode pool each completes or gets 429, none hangs,
the router's memory stays put and every block comes back; schemathesis fuzzes its served OpenAPI
document: no 5xx, every 4xx an OpenAI-format error.

The router runs in this process (its counters are read directly and on /metrics); the decode
worker's counters and socket addresses are read inside its Ray actor.
"""

from __future__ import annotations

import asyncio
import collections
import json
import types

import httpx
import openai
import psutil
import pytest
import schemathesis
from schemathesis import GenerationMode
import zmq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine import EngineArgs
from wire.socket_security import SMALL_MESSAGE_BYTES, ClusterKey, refusals
from router.config import RouterConfig
from tests.conftest import hf_greedy
from tests.e2e.harness import wait_for
from tests.e2e.router_cluster import CHAT_TEMPLATE, router_on_ray
from tests.kvtransfer.hostile import close_all, delta, send_hostile, wait_refused

MODEL = "tiny-llama"
MAX_IN_FLIGHT = 8
FLOOD = 500
FUZZ_EXAMPLES = 50  # per operation: the whole fuzz run stays well under a minute
API_KEY = "sk-e2e-security"
CLUSTER_KEY = ClusterKey.generate()


@pytest.fixture(scope="module")
def served(ray_session, tiny_model_dirs):
    model_dir = tiny_model_dirs["llama"]
    args = EngineArgs(model=model_dir, num_kv_blocks=48, max_model_len=256, dtype="float32")
    config = RouterConfig(model_dir, MODEL, max_model_len=256, chat_template=CHAT_TEMPLATE, max_in_flight=MAX_IN_FLIGHT,
                          api_key=API_KEY, cluster_key=CLUSTER_KEY, max_request_body_bytes=256 * 1024)  # fmt: skip
    with router_on_ray(ray_session, args, config) as stack:
        client = openai.OpenAI(base_url=f"{stack.server.url}/v1", api_key=API_KEY, max_retries=0, timeout=60)
        yield types.SimpleNamespace(client=client, model_dir=model_dir, ray=ray_session, **vars(stack))


def _decode_addresses(s) -> tuple[str, str]:
    """The decode worker's KV receiver and inbox addresses (fixed once it is built)."""
    return s.ray.get(s.actors[1].__ray_call__.remote(
        lambda actor: (actor.hosted.worker.receiver_address, actor.hosted.worker.inbox.address)))  # fmt: skip


def _decode_refusals(s) -> dict:
    return s.ray.get(s.actors[1].__ray_call__.remote(lambda actor: refusals()))


def test_internal_sockets_refuse_hostile_traffic_and_the_cluster_still_serves(served):
    s = served
    kv_address, inbox_address = _decode_addresses(s)
    stream_address = s.app.state.router.dispatcher.stream.address
    oversized = SMALL_MESSAGE_BYTES + 1  # over every limit here (the tiny model's KV cache layers are smaller)
    router_before, worker_before = refusals(), _decode_refusals(s)
    clients = send_hostile(stream_address, CLUSTER_KEY, oversized)
    clients += send_hostile(kv_address, CLUSTER_KEY, oversized, zmq.DEALER)
    clients += send_hostile(inbox_address, CLUSTER_KEY, oversized)
    control_address = s.ray.get(s.actors[1].control_address.remote())
    clients += send_hostile(control_address, CLUSTER_KEY, oversized, zmq.DEALER)
    # The router's stream admits the workers' own keys only, a worker's control socket the router's only:
    # even the cluster key's holder never gets in.
    wait_refused(refusals, router_before, "token_stream", reasons=("unauthenticated", "bad_handshake"))
    wait_refused(lambda: _decode_refusals(s), worker_before, "control", reasons=("unauthenticated", "bad_handshake"))
    for kind in ("kv", "inbox"):
        wait_refused(lambda: _decode_refusals(s), worker_before, kind)

    prompt = [1, 5, 9, 13, 17, 21, 25, 29, 33, 37, 41, 45, 49, 53, 57, 61, 65, 69]  # over a block: KV travels
    out = s.client.completions.create(model=MODEL, prompt=prompt, temperature=0, max_tokens=8,
                                      extra_body={"ignore_eos": True})  # fmt: skip
    assert s.app.state.router.registry.live("decode") and out.choices[0].finish_reason == "length"
    assert out.choices[0].text == _greedy_text(s, prompt)
    assert delta(refusals(), router_before, "token_stream")["malformed"] == 0  # nothing of theirs was read
    assert delta(_decode_refusals(s), worker_before, "control")["malformed"] == 0
    assert all(delta(_decode_refusals(s), worker_before, kind)["malformed"] == 1 for kind in ("kv", "inbox"))
    metrics = _metrics(s)
    assert 'tandem:internal_messages_refused_total{reason="unauthenticated",socket="token_stream",worker="router"}' \
        in metrics
    # The decode worker's own refusals reach the router's /metrics with its heartbeats.
    wait_for(lambda: 'reason="malformed",socket="inbox",worker="decode-0"' in _metrics(s), "the worker's refusals")
    close_all(clients)


def test_a_flood_of_streams_each_completes_or_gets_429_and_memory_stays_bounded(served):
    s = served
    _flood(s, FLOOD)  # warm up: the router's buffers and caches reach their working size (~40 MiB, once)
    rss_before = psutil.Process().memory_info().rss
    completed, refused = _flood(s, FLOOD)
    rss_growth = psutil.Process().memory_info().rss - rss_before
    print(f"flood of {FLOOD}: {completed} completed, {refused} got 429, router RSS grew {rss_growth >> 20} MiB")
    assert completed + refused == FLOOD and completed >= MAX_IN_FLIGHT and refused > 0
    # A request refused or finished leaves nothing behind: no admission, no open per-request queue.
    state = s.app.state.router
    assert state.runner.admission.in_use == 0 and not state.dispatcher.stream._requests
    assert rss_growth < 32 << 20, f"the router grew by {rss_growth >> 20} MiB over {FLOOD} requests"
    wait_for(lambda: all(s.ray.get([a.is_idle.remote() for a in s.actors])), "the workers to go idle")
    assert s.ray.get([a.pool_all_free.remote() for a in s.actors]) == [True, True]


def _flood(s, count: int) -> tuple[int, int]:
    """`count` concurrent streaming completions; (completed, refused with 429). Anything else fails the test,
    and so does any stream still open after the deadline (a hang)."""
    client = openai.AsyncOpenAI(base_url=str(s.client.base_url), api_key=API_KEY, max_retries=0, timeout=120)

    async def one(i: int) -> str:
        try:
            stream = await client.completions.create(model=MODEL, prompt=f"request {i}", max_tokens=4, stream=True,
                                                     temperature=0, extra_body={"ignore_eos": True})  # fmt: skip
            reasons = [chunk.choices[0].finish_reason async for chunk in stream if chunk.choices]
            assert reasons[-1] == "length", reasons
            return "completed"
        except openai.RateLimitError as err:
            assert err.response.headers["retry-after"] == "1" and err.code == "too_many_requests"
            return "refused"

    async def all_of_them():
        try:
            return await asyncio.wait_for(asyncio.gather(*(one(i) for i in range(count))), 300)
        finally:
            await client.close()

    outcomes = asyncio.run(all_of_them())
    return outcomes.count("completed"), outcomes.count("refused")


def _greedy_text(s, prompt_ids) -> str:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(s.model_dir).decode(hf_greedy(s.model_dir, prompt_ids, 8),
                                                              skip_special_tokens=True)  # fmt: skip


def _metrics(s) -> str:
    import httpx

    return httpx.get(f"{s.server.url}/metrics").text


def test_fuzzed_requests_never_get_a_5xx_and_every_4xx_is_an_openai_error(served):
    """schemathesis generates requests (valid and invalid) for each operation of the served OpenAPI document."""
    schema = schemathesis.openapi.from_url(f"{served.server.url}/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    assert {op.path for op in operations} >= {"/v1/completions", "/v1/chat/completions", "/v1/models"}
    statuses = collections.Counter()
    for operation in operations:
        modes = (GenerationMode.POSITIVE, GenerationMode.NEGATIVE) if operation.body else (GenerationMode.POSITIVE,)
        for mode in modes:  # valid requests, then invalid ones (where there is a body to get wrong)
            _fuzz(operation, mode, statuses)
    print(f"fuzz: {sorted(statuses.items())}")
    assert statuses[200] and statuses[400]  # both kinds reached the server and its handlers


def _served_model(case):
    """Valid requests name the served model (a random name only ever meets the 404 of an unknown model)."""
    if isinstance(case.body, dict) and "model" in case.body and case.body.get("model") != MODEL:
        case.body["model"] = MODEL if len(str(case.body)) % 4 else case.body["model"]  # a quarter keep theirs
    return case


def _fuzz(operation, mode: GenerationMode, statuses: collections.Counter) -> None:
    @given(operation.as_strategy(generation_mode=mode).map(_served_model))
    @settings(max_examples=FUZZ_EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    def check(case):
        response = case.call(headers={"Authorization": f"Bearer {API_KEY}"}, timeout=120)
        _no_5xx_and_openai_errors(response, statuses, f"{case.method} {case.path} {case.body!r}")

    check()


def _no_5xx_and_openai_errors(response, statuses: collections.Counter, what: str) -> None:
    """Count `response`'s status; it must be below 500, and a 4xx an OpenAI-format error."""
    statuses[response.status_code] += 1
    assert response.status_code < 500, f"{what[:300]}: {response.text[:500]}"
    if response.status_code >= 400:
        error = response.json()["error"]
        assert set(error) == {"message", "type", "param", "code"} and isinstance(error["message"], str)


# ---- the extra fields, fuzzed one at a time -------------------------------------------------------------
# The OpenAPI document types them loosely (a dict, a list, any JSON), so schemathesis's cases rarely reach
# their insides: here each gets arbitrary JSON and near-valid shapes (schemas, regexes, grammars, tool lists)
# beside an otherwise valid body.

EXTRA_EXAMPLES = 20  # per field: 300 bodies a run, new ones each run (no example database)
_scalar = (st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False, allow_infinity=False)
           | st.text(max_size=12))  # fmt: skip
_json = st.recursive(_scalar, lambda inner: st.lists(inner, max_size=4)
                     | st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=12)  # fmt: skip
_regex = st.text(alphabet="ab()[]{}*+?|\\.^$0-9,-", max_size=24)
_grammar = st.text(alphabet='root:= "ab|()*+?[]\n\\', max_size=40).map(lambda body: "root ::= " + body)
_schema = st.recursive(
    st.fixed_dictionaries({"type": st.sampled_from(["string", "integer", "number", "boolean", "null", "nonsense"])},
                          optional={"pattern": _regex, "enum": st.lists(_json, max_size=3),
                                    "minLength": st.integers(-3, 20), "maximum": st.integers()}),  # fmt: skip
    lambda inner: st.fixed_dictionaries(
        {"type": st.sampled_from(["object", "array"])},
        optional={"properties": st.dictionaries(st.text(max_size=6), inner | _json, max_size=3),
                  "items": inner | _json, "required": st.lists(st.text(max_size=6) | _json, max_size=3),
                  "minItems": st.integers(-3, 5), "additionalProperties": st.booleans() | inner}),  # fmt: skip
    max_leaves=8)  # fmt: skip
_function = st.fixed_dictionaries({"name": st.text(max_size=10) | _json},
                                  optional={"parameters": _schema | _json, "description": st.text(max_size=10)})
_tools = st.lists(st.fixed_dictionaries({"type": st.sampled_from(["function", "other"]), "function": _function | _json})
                  | _json, max_size=3)  # fmt: skip
_call = st.fixed_dictionaries({"name": st.text(max_size=6), "arguments": st.text(max_size=12) | _json})
_tool_call = st.fixed_dictionaries({"id": st.text(max_size=6), "type": st.just("function"), "function": _call})
_tool_calls = st.lists(_tool_call | _json, max_size=2)
EXTRA_FIELDS = {  # field -> (values, endpoints it is sent to)
    "response_format": (st.fixed_dictionaries({"type": st.sampled_from(["json_object", "json_schema", "text", "x"])},
                                              optional={"json_schema": st.fixed_dictionaries(
                                                  {"name": st.text(max_size=6)}, optional={"schema": _schema | _json,
                                                                                           "strict": _json})})
                        | _json, ("completions", "chat")),  # fmt: skip
    "structured_outputs": (st.fixed_dictionaries({}, optional={"json": _schema | _json, "regex": _regex | _json,
                                                               "choice": st.lists(st.text(max_size=6)) | _json,
                                                               "grammar": _grammar | _json, "json_object": _json})
                           | _json, ("completions", "chat")),  # fmt: skip
    "guided_json": (_schema | _json | _schema.map(json.dumps), ("completions", "chat")),
    "guided_regex": (_regex | _json, ("completions", "chat")),
    "guided_choice": (st.lists(st.text(max_size=8) | _json, max_size=4) | _json, ("completions", "chat")),
    "guided_grammar": (_grammar | _json, ("completions", "chat")),
    "logit_bias": (st.dictionaries(st.text(alphabet="0123456789-x", max_size=7), _json, max_size=4) | _json,
                   ("completions", "chat")),  # fmt: skip
    "prompt_logprobs": (st.integers(-3, 40) | _json, ("completions", "chat")),
    "tools": (_tools | _json, ("chat",)),
    "tool_choice": (st.sampled_from(["auto", "none", "required", "x"]) | st.fixed_dictionaries(
        {"type": st.sampled_from(["function", "x"]), "function": _function | _json}) | _json, ("chat",)),  # fmt: skip
    "functions": (st.lists(_function | _json, max_size=3) | _json, ("chat",)),
    "function_call": (st.sampled_from(["auto", "none"]) | _function | _json, ("chat",)),
    "tool_calls": (_tool_calls | _json, ("chat",)),  # in an assistant message before the user's
    "content": (st.lists(st.fixed_dictionaries({"type": st.sampled_from(["text", "image_url", "x"]),
                                                "text": st.text(max_size=8) | _json}) | _json, max_size=3)
                | _json, ("chat",)),  # the user message's  # fmt: skip
}


def _body_with(field: str, value, endpoint: str) -> dict:
    body = {"model": MODEL, "max_tokens": 2, "temperature": 0}
    if endpoint == "completions":
        return {**body, "prompt": "Hello", field: value}
    messages = [{"role": "user", "content": "Hello"}]
    if field == "tool_calls":
        messages = [{"role": "assistant", "content": "", "tool_calls": value}, *messages]
    elif field == "content":
        messages = [{"role": "user", "content": value}]
    else:
        body[field] = value
    return {**body, "messages": messages}


@pytest.mark.parametrize("field", sorted(EXTRA_FIELDS))
def test_fuzzed_extra_fields_never_get_a_5xx_and_every_4xx_is_an_openai_error(served, field):
    values, endpoints = EXTRA_FIELDS[field]
    statuses = collections.Counter()

    @given(values, st.sampled_from(endpoints))
    @settings(max_examples=EXTRA_EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    def check(value, endpoint):
        body = _body_with(field, value, endpoint)
        response = httpx.post(f"{served.server.url}/v1/{endpoint.replace('chat', 'chat/completions')}", json=body,
                              headers={"Authorization": f"Bearer {API_KEY}"}, timeout=120)  # fmt: skip
        _no_5xx_and_openai_errors(response, statuses, f"{endpoint} {json.dumps(body)}")

    check()
    print(f"{field}: {sorted(statuses.items())}")
