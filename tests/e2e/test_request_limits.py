"""Hostile request bodies against the router (those of scripts/abuse_table.py): each is answered with a 400 in
well under a second, a stream running beside them keeps going, and nothing is left on the workers."""

from __future__ import annotations

import json
import threading
import time
import types

import httpx
import pytest

from engine import EngineArgs
from router.config import RouterConfig
from scripts.abuse_table import ABUSE, CHAT_ABUSE, DEEP_JSON, NINE_MIB
from tests.e2e.router_cluster import CHAT_TEMPLATE, router_on_ray
from tests.e2e.test_router_openai import _wait_all_free

MODEL = "tiny-llama"


@pytest.fixture(scope="module")
def served(ray_session, tiny_model_dirs):
    model_dir = tiny_model_dirs["llama"]
    args = EngineArgs(model=model_dir, num_kv_blocks=48, max_model_len=256, dtype="float32")
    with router_on_ray(ray_session, args, RouterConfig(model_dir, MODEL, max_model_len=256,
                                                         chat_template=CHAT_TEMPLATE)) as stack:
        yield types.SimpleNamespace(url=stack.server.url, actors=stack.actors)


def _post(url: str, body: dict | bytes, path: str = "/v1/completions") -> tuple[httpx.Response, float]:
    start = time.perf_counter()
    content = body if isinstance(body, bytes) else json.dumps({"model": MODEL, "max_tokens": 2, **body}).encode()
    reply = httpx.post(f"{url}{path}", content=content, headers={"content-type": "application/json"},
                       timeout=30)  # fmt: skip
    return reply, time.perf_counter() - start


def test_hostile_bodies_are_400s_in_well_under_a_second_while_a_stream_keeps_going(served):
    streamed, usage = [], []

    def stream():  # a long request beside the abuse: it must keep producing tokens
        body = {"model": MODEL, "prompt": [5, 17, 42], "max_tokens": 200, "temperature": 0, "stream": True,
                "ignore_eos": True, "stream_options": {"include_usage": True}}  # fmt: skip
        with httpx.stream("POST", f"{served.url}/v1/completions", json=body, timeout=60) as r:
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    streamed.append(time.perf_counter())
                    usage.append(json.loads(line[6:]).get("usage"))

    beside = threading.Thread(target=stream)
    beside.start()
    answers = {}
    for name, (body, param) in ABUSE.items():
        reply, took = _post(served.url, body)
        answers[name] = (reply.status_code, took)
        assert reply.status_code == 400, (name, reply.text[:200])
        assert reply.json()["error"]["param"] == param, (name, reply.json())
        assert took < 1.0, (name, took)
    for name, (body, param) in CHAT_ABUSE.items():
        reply, took = _post(served.url, body, "/v1/chat/completions")
        assert reply.status_code == 400 and reply.json()["error"]["param"] == param, (name, reply.text[:200])
        assert took < 1.0, (name, took)
    big, took = _post(served.url, NINE_MIB)
    assert big.status_code == 413 and took < 1.0
    deep, took = _post(served.url, DEEP_JSON)
    assert deep.status_code == 400 and took < 1.0 and deep.json()["error"]["type"] == "invalid_request_error"
    beside.join(60)
    assert usage[-1]["completion_tokens"] == 200  # the stream beside them was served whole
    gaps = [b - a for a, b in zip(streamed, streamed[1:])]
    assert max(gaps) < 2.0, max(gaps)
    _wait_all_free(served)
