"""The router end to end: the official `openai` client -> router on loopback -> prefill + decode actors on Ray.

One Ray cluster (1 prefill, 1 decode, tiny llama) and one router serve the whole
module. Greedy outputs equal transformers' greedy generate; every error status
comes back in OpenAI's format; a client that drops a stream frees its blocks.
"""

from __future__ import annotations

import re
import types

import httpx
import openai
import pytest
from transformers import AutoTokenizer

from engine import EngineArgs
from router.app import create_app
from router.config import RouterConfig
from router.server import RouterServer
from tests.conftest import hf_greedy
from tests.e2e.harness import wait_for
from tests.e2e.router_cluster import CHAT_TEMPLATE, router_on_ray
from tests.output_text.test_stream import first_stop

MODEL = "tiny-llama"
GREEDY = dict(temperature=0, max_tokens=8, extra_body={"ignore_eos": True})
MAX_IN_FLIGHT = 6


@pytest.fixture(scope="module")
def served(ray_session, tiny_model_dirs):
    model_dir = tiny_model_dirs["llama"]
    args = EngineArgs(model=model_dir, num_kv_blocks=48, max_model_len=256, dtype="float32")
    config = RouterConfig(model_dir, MODEL, max_model_len=256, chat_template=CHAT_TEMPLATE,
                          max_in_flight=MAX_IN_FLIGHT)  # fmt: skip
    with router_on_ray(ray_session, args, config) as stack:
        client = openai.OpenAI(base_url=f"{stack.server.url}/v1", api_key="unused", max_retries=0, timeout=60)
        yield types.SimpleNamespace(client=client, server=stack.server, actors=stack.actors, model_dir=model_dir,
                                    tokenizer=AutoTokenizer.from_pretrained(model_dir), app=stack.app)  # fmt: skip


def _greedy_text(s, prompt_ids, n=8) -> str:
    return s.tokenizer.decode(hf_greedy(s.model_dir, prompt_ids, n), skip_special_tokens=True)


def _chat_ids(s, messages) -> list[int]:
    text = s.tokenizer.apply_chat_template(messages, chat_template=CHAT_TEMPLATE, add_generation_prompt=True,
                                           tokenize=False)  # fmt: skip
    return s.tokenizer(text, add_special_tokens=False)["input_ids"]


def _wait_all_free(s) -> None:
    import ray

    wait_for(lambda: all(ray.get([a.is_idle.remote() for a in s.actors])), "the workers to go idle")
    assert ray.get([a.pool_all_free.remote() for a in s.actors]) == [True, True]


def test_completion_equals_transformers_greedy_with_usage(served):
    prompt = "The quick brown fox"
    ids = served.tokenizer(prompt)["input_ids"]
    out = served.client.completions.create(model=MODEL, prompt=prompt, **GREEDY)
    assert out.choices[0].text == _greedy_text(served, ids)
    assert out.choices[0].finish_reason == "length"
    assert (out.usage.prompt_tokens, out.usage.completion_tokens, out.usage.total_tokens) == (len(ids), 8, len(ids) + 8)
    by_ids = served.client.completions.create(model=MODEL, prompt=ids, **GREEDY)
    assert by_ids.choices[0].text == out.choices[0].text


def test_streamed_completion_has_the_same_text_then_usage(served):
    prompt = "Paris is the capital of"
    ids = served.tokenizer(prompt)["input_ids"]
    chunks = list(served.client.completions.create(model=MODEL, prompt=prompt, stream=True,
                                                   stream_options={"include_usage": True}, **GREEDY))  # fmt: skip
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == _greedy_text(served, ids)
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 8
    assert chunks[-1].usage.prompt_tokens == len(ids)


def test_chat_streamed_and_not_equals_transformers_greedy(served):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "def add(a, b):"}]
    expected = _greedy_text(served, _chat_ids(served, messages))
    out = served.client.chat.completions.create(model=MODEL, messages=messages, **GREEDY)
    assert out.choices[0].message.content == expected and out.choices[0].message.role == "assistant"
    assert out.usage.prompt_tokens == len(_chat_ids(served, messages)) and out.usage.completion_tokens == 8
    chunks = list(served.client.chat.completions.create(model=MODEL, messages=messages, stream=True, **GREEDY))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == expected
    assert chunks[-1].choices[0].finish_reason == "length"


def test_n_choices_and_several_prompts(served):
    prompts = ["The quick brown fox", "Large language models"]
    out = served.client.completions.create(model=MODEL, prompt=prompts, n=2, **GREEDY)
    assert [c.index for c in out.choices] == [0, 1, 2, 3]
    for c in out.choices:
        assert c.text == _greedy_text(served, served.tokenizer(prompts[c.index // 2])["input_ids"])
    assert out.usage.completion_tokens == 4 * 8
    assert out.usage.prompt_tokens == sum(len(served.tokenizer(p)["input_ids"]) for p in prompts)
    chunks = list(served.client.completions.create(model=MODEL, prompt=prompts[0], n=3, stream=True, **GREEDY))
    texts = ["".join(c.choices[0].text for c in chunks if c.choices[0].index == i) for i in range(3)]
    assert texts == [out.choices[0].text] * 3


def test_stop_string_ends_the_text_where_it_first_appears_and_the_workers_stop(served):
    prompt = "héllo wörld, 世界"
    greedy = hf_greedy(served.model_dir, served.tokenizer(prompt)["input_ids"], 16)
    full = served.tokenizer.decode(greedy, skip_special_tokens=True)
    stop = full[5:7]  # the text before it cannot contain it: the first match is here
    assert stop not in full[:6], "pick another prompt: the stop string occurs earlier"
    # The router bills the tokens it sent: up to the one whose text completes the stop string.
    sent = first_stop(served.tokenizer, greedy, stop)
    args = dict(model=MODEL, prompt=prompt, temperature=0, max_tokens=16, stop=[stop], extra_body={"ignore_eos": True})
    out = served.client.completions.create(**args)
    assert (out.choices[0].text, out.choices[0].finish_reason) == (full[:5], "stop")
    assert out.usage.completion_tokens == sent < 16
    chunks = list(served.client.completions.create(stream=True, **args))
    assert "".join(c.choices[0].text for c in chunks) == full[:5]
    _wait_all_free(served)  # the router aborted what the workers would have gone on making


def test_logprobs_of_greedy_tokens_are_the_top_ones(served):
    out = served.client.completions.create(model=MODEL, prompt="Berlin is", logprobs=2, **GREEDY)
    lp = out.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 8
    for chosen, top in zip(lp.token_logprobs, lp.top_logprobs):
        assert len(top) == 2 and chosen <= 0 and chosen == pytest.approx(max(top.values()))
    chat = served.client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}],
                                                 logprobs=True, top_logprobs=1, **GREEDY)  # fmt: skip
    assert len(chat.choices[0].logprobs.content) == 8


def test_models_health_metrics_and_openapi(served):
    assert [m.id for m in served.client.models.list().data] == [MODEL]
    assert httpx.get(f"{served.server.url}/health").status_code == 200
    schema = httpx.get(f"{served.server.url}/openapi.json").json()
    assert {"/v1/completions", "/v1/chat/completions", "/v1/models", "/health"} <= set(schema["paths"])
    served.client.completions.create(model=MODEL, prompt="Paris", **GREEDY)
    metrics = httpx.get(f"{served.server.url}/metrics").text
    for name in ("tandem:time_to_first_token_seconds_count", "tandem:time_per_output_token_seconds_count",
                 "tandem:e2e_request_latency_seconds_count", 'tandem:request_success_total{finished_reason="length"}',
                 'tandem:kv_cache_usage_perc{role="decode",worker="decode-0"}', "tandem:prefix_cache_hits_total",
                 'tandem:http_requests_total{endpoint="/v1/completions",status="200"}'):  # fmt: skip
        assert name in metrics, name
    # Paths no route serves are one label: random paths cannot grow /metrics.
    for i in range(200):
        assert httpx.get(f"{served.server.url}/no/such/path-{i}").status_code == 404
    after = httpx.get(f"{served.server.url}/metrics").text
    assert 'tandem:http_requests_total{endpoint="unmatched",status="404"} 200.0' in after
    assert "path-" not in after and len(after) < len(metrics) + 1000
    assert httpx.get(f"{served.server.url}/v1/completions").status_code == 405  # its route, another method
    assert 'endpoint="/v1/completions",status="405"' in httpx.get(f"{served.server.url}/metrics").text


def _prefix_cache_hits(s) -> float:
    """The router's count of prompt tokens served from decode's prefix cache, from /metrics."""
    text = httpx.get(f"{s.server.url}/metrics").text
    return float(re.search(r"^tandem:prefix_cache_hits_total (\S+)$", text, re.MULTILINE).group(1))


def test_cache_salt_isolates_tenants_prefix_caches_through_prefill_and_decode(served):
    """vLLM's `cache_salt` over HTTP, through prefill -> decode: only the same salt reuses cached blocks."""
    ids = [(29 * i + 17) % 380 + 3 for i in range(56)]  # 3 full blocks of 16 and a partial one: none seen before
    url = f"{served.server.url}/v1/completions"

    def hits_of(**salt) -> float:
        before = _prefix_cache_hits(served)
        out = served.client.completions.create(model=MODEL, prompt=ids, **{**GREEDY, "extra_body": {
            "ignore_eos": True, **salt}})  # fmt: skip
        assert out.choices[0].text == _greedy_text(served, ids)
        return _prefix_cache_hits(served) - before

    assert hits_of(cache_salt="tenant-a") == 0
    assert hits_of(cache_salt="tenant-a") == 48  # decode reserved only the partial block: its 3 full ones hit
    assert hits_of(cache_salt="tenant-b") == 0  # another tenant's copy of the same prompt is not shared
    assert hits_of() == 0  # nor with an unsalted request
    for bad in (5, ""):  # not a string; empty (vLLM refuses it too)
        assert _error(httpx.post(url, json={"model": MODEL, "prompt": "hi", "cache_salt": bad}), 400)["param"] == "cache_salt"
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "cache_salt": "x" * 257}
    assert _error(httpx.post(f"{served.server.url}/v1/chat/completions", json=chat), 400)["param"] == "cache_salt"
    _wait_all_free(served)


def _error(response: httpx.Response, status: int) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and "Traceback" not in error["message"]
    return error


def test_invalid_requests_are_400_and_an_unknown_model_404(served):
    url = f"{served.server.url}/v1/completions"
    assert _error(httpx.post(url, content=b"{not json", headers={"content-type": "application/json"}), 400)
    assert _error(httpx.post(url, json={"model": MODEL, "prompt": "hi", "temperature": -1}), 400)["param"] == "temperature"
    assert _error(httpx.post(url, json={"model": MODEL, "prompt": [5] * 300}), 400)["param"] == "prompt"
    assert _error(httpx.post(url, json={"model": MODEL, "prompt": "hi", "max_tokens": 1000}), 400)["param"] == "max_tokens"
    with pytest.raises(openai.BadRequestError):
        served.client.completions.create(model=MODEL, prompt="hi", max_tokens=1000)
    with pytest.raises(openai.NotFoundError):
        served.client.completions.create(model="gpt-4", prompt="hi")
    assert _error(httpx.post(f"{served.server.url}/v1/chat/completions", json={"model": "x", "messages": []}), 400)
    # No message can carry a top_k of 2**64: the request's fault, so a 400, and the workers stay in their
    # pools (such a value once marked the decode worker dead).
    too_big = {"model": MODEL, "prompt": "hi", "top_k": 2**64}
    assert "64-bit" in _error(httpx.post(url, json=too_big), 400)["message"]
    assert all(w.alive for w in served.app.state.router.registry.workers.values())


def test_full_admission_is_429_with_retry_after(served):
    url = f"{served.server.url}/v1/completions"
    hog = dict(model=MODEL, prompt="The quick brown fox", n=MAX_IN_FLIGHT, max_tokens=100, stream=True,
               extra_body={"ignore_eos": True})  # fmt: skip
    with served.client.completions.create(**hog) as stream:
        next(iter(stream))
        response = httpx.post(url, json={"model": MODEL, "prompt": "hi"})
        assert _error(response, 429)["type"] == "rate_limit_exceeded"
        assert response.headers["retry-after"] == "1"
    _wait_all_free(served)


def _aborted_count(s) -> float:
    metrics = httpx.get(f"{s.server.url}/metrics").text
    line = 'tandem:request_success_total{finished_reason="abort"}'
    return sum(float(row.split()[-1]) for row in metrics.splitlines() if row.startswith(line))


def test_a_dropped_stream_is_aborted_on_both_workers(served):
    before = _aborted_count(served)
    args = dict(model=MODEL, prompt="Large language models predict", max_tokens=200, stream=True,
                extra_body={"ignore_eos": True})  # fmt: skip
    with served.client.completions.create(**args) as stream:
        next(iter(stream))
    _wait_all_free(served)
    assert _aborted_count(served) == before + 1


def test_a_client_gone_before_a_whole_response_is_aborted_too(served):
    before = _aborted_count(served)
    body = {"model": MODEL, "prompt": "Large language models predict", "max_tokens": 240, "ignore_eos": True}
    with pytest.raises(httpx.ReadTimeout):  # the client gives up long before 240 tokens: its connection closes
        httpx.post(f"{served.server.url}/v1/completions", json=body, timeout=httpx.Timeout(5, read=0.05))
    _wait_all_free(served)
    wait_for(lambda: _aborted_count(served) == before + 1, "the router to count the abort")


def test_no_live_worker_is_503(served):
    config = RouterConfig(served.model_dir, MODEL, max_model_len=256)
    server = RouterServer(create_app(config))  # no worker registered
    try:
        assert _error(httpx.get(f"{server.url}/health"), 503)["code"] == "no_live_worker"
        response = httpx.post(f"{server.url}/v1/completions", json={"model": MODEL, "prompt": "hi"})
        assert "decode" in _error(response, 503)["message"]
    finally:
        server.stop()


def _decode_counter(s, name: str) -> float:
    metrics = httpx.get(f"{s.server.url}/metrics").text
    line = f'tandem:{name}_total{{role="decode",worker="decode-0"}}'
    return sum(float(row.split()[-1]) for row in metrics.splitlines() if row.startswith(line))


def test_kv_transfer_metrics_count_one_request_by_its_bytes(served):
    import math
    import random

    import ray

    from wire.codec import decode
    from wire.requests import WorkerLoad

    # K and V of one block in every layer, and the block size, read off the decode worker's real cache tensors.
    block_bytes, block_size = ray.get(served.actors[1].__ray_call__.remote(lambda actor: (
        sum(k[0].nbytes + v[0].nbytes for k, v in actor.hosted.worker.engine.runner.kv_caches),
        actor.hosted.worker.engine.runner.kv_caches[0][0].shape[1])))  # fmt: skip (the cache's shape never changes)
    _wait_all_free(served)  # earlier tests' transfers are over; the router shows them once it has refreshed
    settled = decode(ray.get(served.actors[1].load.remote()), WorkerLoad)
    wait_for(lambda: _decode_counter(served, "kv_transfers") == settled.kv_transfers, "the router to catch up")
    before = {n: _decode_counter(served, n) for n in ("kv_transfers", "kv_transfer_bytes", "kv_transfer_seconds")}
    prompt = random.Random(7).sample(range(10, 300), 37)  # shares no block with any other test's prompt
    served.client.completions.create(model=MODEL, prompt=prompt, **GREEDY)
    wait_for(lambda: _decode_counter(served, "kv_transfers") == before["kv_transfers"] + 1, "the next load refresh")
    sent = _decode_counter(served, "kv_transfer_bytes") - before["kv_transfer_bytes"]
    assert sent == math.ceil(len(prompt) / block_size) * block_bytes
    assert _decode_counter(served, "kv_transfer_seconds") > before["kv_transfer_seconds"]


def test_tokenize_detokenize_and_version_in_vllms_shapes(served):
    url = served.server.url
    text = "The capital of France is"
    out = httpx.post(f"{url}/tokenize", json={"model": MODEL, "prompt": text}).json()
    assert out["tokens"] == served.tokenizer(text)["input_ids"] and out["count"] == len(out["tokens"])
    assert out["max_model_len"] == 256 and out["token_strs"] is None

    messages = [{"role": "user", "content": "Hi there"}]
    chat = httpx.post(f"{url}/tokenize", json={"messages": messages, "return_token_strs": True}).json()
    assert chat["tokens"] == _chat_ids(served, messages)  # what /v1/chat/completions sends the workers
    assert chat["token_strs"] == served.tokenizer.convert_ids_to_tokens(chat["tokens"])

    back = httpx.post(f"{url}/detokenize", json={"model": MODEL, "tokens": out["tokens"]}).json()
    assert back == {"prompt": served.tokenizer.decode(out["tokens"])}
    assert httpx.get(f"{url}/version").json()["version"]

    both = httpx.post(f"{url}/tokenize", json={"prompt": text, "messages": messages})
    assert both.status_code == 400 and both.json()["error"]["type"] == "invalid_request_error"
    assert httpx.post(f"{url}/detokenize", json={"tokens": [10**9]}).status_code == 400
    assert httpx.post(f"{url}/tokenize", json={"model": "other", "prompt": text}).status_code == 404


def test_logit_bias_steers_greedy_output_through_both_workers(served):
    forced = served.tokenizer.convert_tokens_to_ids(served.tokenizer.tokenize(" the"))[0]
    out = served.client.completions.create(model=MODEL, prompt=[5, 17, 42], temperature=0, max_tokens=4,
                                           logit_bias={str(forced): 100}, extra_body={"ignore_eos": True})  # fmt: skip
    assert out.choices[0].text == served.tokenizer.decode([forced] * 4)
    for bias in ({"999999": 1}, {"x": 1}, {"5": 150}):
        with pytest.raises(openai.BadRequestError, match="logit_bias"):
            served.client.completions.create(model=MODEL, prompt=[5, 17], max_tokens=2, logit_bias=bias)


def test_fields_not_honoured_yet_are_refused_naming_them_never_ignored(served):
    messages = [{"role": "user", "content": "Say hi"}]
    function = {"name": "f", "parameters": {"type": "object", "properties": {}}}
    for field, value in (("functions", [function]), ("function_call", "auto")):
        with pytest.raises(openai.BadRequestError) as refused:
            served.client.chat.completions.create(model=MODEL, messages=messages, max_tokens=2, **{field: value})
        assert refused.value.body["param"] == field
    with pytest.raises(openai.BadRequestError, match="prompt_logprobs"):  # on completions only, so far
        served.client.chat.completions.create(model=MODEL, messages=messages, max_tokens=2,
                                              extra_body={"prompt_logprobs": 1})  # fmt: skip
    # Their neutral values ask for nothing and are served.
    out = served.client.chat.completions.create(model=MODEL, messages=messages, max_tokens=2, tool_choice="none",
                                                response_format={"type": "text"}, tools=[])  # fmt: skip
    assert out.choices[0].finish_reason == "length"

def test_each_choice_says_where_its_time_went_and_the_phases_add_up(served):
    """Queue, prefill (the prefill worker's), KV transfer, decode seat, first decode step (decode's), decode:
    in the response and in /metrics, adding up to the request's end-to-end time."""
    import json
    import time

    body = {"model": MODEL, "prompt": "Paris is the capital of", "max_tokens": 8, "temperature": 0, "ignore_eos": True}
    started = time.monotonic()
    reply = httpx.post(f"{served.server.url}/v1/completions", json=body, timeout=60).json()
    wall = time.monotonic() - started
    (phases,) = reply["phases"]
    assert set(phases) == {"queue_s", "prefill_s", "kv_transfer_s", "decode_seat_s", "first_decode_s", "decode_s"}
    assert all(v >= 0 for v in phases.values())
    assert phases["prefill_s"] > 0 and phases["first_decode_s"] > 0 and phases["decode_s"] > 0
    assert 0 < sum(phases.values()) <= wall
    streamed = httpx.post(f"{served.server.url}/v1/completions", timeout=60,
                          json={**body, "stream": True, "stream_options": {"include_usage": True}})  # fmt: skip
    chunks = [json.loads(line[len("data: "):]) for line in streamed.text.splitlines() if line.startswith("data: {")]
    assert chunks[-1]["phases"][0].keys() == phases.keys()  # with the usage, at the end of a stream
    metrics = httpx.get(f"{served.server.url}/metrics").text
    for name in ("queue", "prefill", "kv_transfer", "decode_seat", "first_decode", "decode"):
        assert f"tandem:request_{name}_time_seconds_count" in metrics, name
    assert "tandem:request_phase_accounting_errors_total 0.0" in metrics
