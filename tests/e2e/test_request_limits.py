"""Hostile request bodies against the router (those of scripts/abuse_table.py): each is answered with a 400 in
well under a second, a stream running beside them keeps going, and nothing is left on the workers."""

from __future__ import annotations

import json
import threading
import types

import httpx
import pytest

from engine import EngineArgs
from router.config import RouterConfig
from scripts.abuse_table import ABUSE, CHAT_ABUSE, DEEP_JSON, EXTRA_ABUSE, NINE_MIB, TOKENIZE_ABUSE, request_bytes
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


def _post(url: str, body: dict | bytes, path: str = "/v1/completions") -> httpx.Response:
    """How long the refusals take is `scripts/abuse_table.py`'s to measure (RELIABILITY.md), not a test's."""
    content = request_bytes(body, MODEL, path)
    return httpx.post(f"{url}{path}", content=content, headers={"content-type": "application/json"}, timeout=30)


def test_hostile_bodies_are_400s_while_a_stream_keeps_going(served):
    usage = []

    def stream():  # a long request beside the abuse: it must keep producing tokens
        body = {"model": MODEL, "prompt": [5, 17, 42], "max_tokens": 200, "temperature": 0, "stream": True,
                "ignore_eos": True, "stream_options": {"include_usage": True}}  # fmt: skip
        with httpx.stream("POST", f"{served.url}/v1/completions", json=body, timeout=60) as r:
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    usage.append(json.loads(line[6:]).get("usage"))

    beside = threading.Thread(target=stream)
    beside.start()
    for name, (body, param) in ABUSE.items():
        reply = _post(served.url, body)
        assert reply.status_code == 400, (name, reply.text[:200])
        assert reply.json()["error"]["param"] == param, (name, reply.json())
    for name, (body, param) in CHAT_ABUSE.items():
        reply = _post(served.url, body, "/v1/chat/completions")
        assert reply.status_code == 400 and reply.json()["error"]["param"] == param, (name, reply.text[:200])
    for name, (body, param, path) in {**TOKENIZE_ABUSE, **EXTRA_ABUSE}.items():
        reply = _post(served.url, body, path)
        if param is None:  # legitimate work (here past the tiny model's context, maybe): never a 5xx
            assert reply.status_code < 500, (name, reply.text[:200])
        else:
            assert reply.status_code == 400 and reply.json()["error"]["param"] == param, (name, reply.text[:200])
    big = _post(served.url, NINE_MIB)
    assert big.status_code == 413
    deep = _post(served.url, DEEP_JSON)
    assert deep.status_code == 400 and deep.json()["error"]["type"] == "invalid_request_error"
    beside.join(60)
    assert usage[-1]["completion_tokens"] == 200  # the stream beside them was served whole
    _wait_all_free(served)
