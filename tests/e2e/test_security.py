"""A served cluster with every guard on (API key, cluster key, body limit): hostile traffic on its
internal sockets is refused and counted, and it still answers like transformers; schemathesis
fuzzes its served OpenAPI document: no 5xx, every 4xx an OpenAI-format error.

The router runs in this process (its counters are read directly and on /metrics); the decode
worker's counters and socket addresses are read inside its Ray actor.
"""

from __future__ import annotations

import types

import openai
import pytest
import zmq

from engine import EngineArgs
from kvtransfer.socket_security import SMALL_MESSAGE_BYTES, ClusterKey, refusals
from router.config import RouterConfig
from tests.conftest import hf_greedy
from tests.e2e.router_cluster import CHAT_TEMPLATE, router_on_ray
from tests.kvtransfer.hostile import close_all, delta, send_hostile, wait_refused

MODEL = "tiny-llama"
API_KEY = "sk-e2e-security"
CLUSTER_KEY = ClusterKey.generate()


@pytest.fixture(scope="module")
def served(ray_session, tiny_model_dirs):
    model_dir = tiny_model_dirs["llama"]
    args = EngineArgs(model=model_dir, num_kv_blocks=48, max_model_len=256)
    config = RouterConfig(model_dir, MODEL, max_model_len=256, chat_template=CHAT_TEMPLATE, max_in_flight=8,
                          api_key=API_KEY, cluster_key=CLUSTER_KEY, max_request_body_bytes=256 * 1024)  # fmt: skip
    with router_on_ray(ray_session, args, config) as stack:
        client = openai.OpenAI(base_url=f"{stack.server.url}/v1", api_key=API_KEY, max_retries=0, timeout=60)
        yield types.SimpleNamespace(client=client, model_dir=model_dir, ray=ray_session, **vars(stack))


def _in_decode_worker(s, fn):
    """`fn(decode worker)` on the decode actor's step-loop thread."""
    return s.ray.get(s.actors[1].__ray_call__.remote(lambda actor: actor.loop.call(fn)))


def _decode_refusals(s) -> dict:
    return s.ray.get(s.actors[1].__ray_call__.remote(lambda actor: refusals()))


def test_internal_sockets_refuse_hostile_traffic_and_the_cluster_still_serves(served):
    s = served
    kv_address, inbox_address = _in_decode_worker(s, lambda w: (w.receiver.address, w.inbox.address))
    stream_address = s.app.state.router.dispatcher.stream.address
    oversized = SMALL_MESSAGE_BYTES + 1  # over every limit here (the tiny model's KV cache layers are smaller)
    router_before, worker_before = refusals(), _decode_refusals(s)
    clients = send_hostile(stream_address, CLUSTER_KEY, oversized)
    clients += send_hostile(kv_address, CLUSTER_KEY, oversized, zmq.DEALER)
    clients += send_hostile(inbox_address, CLUSTER_KEY, oversized)
    wait_refused(refusals, router_before, "token_stream")
    for kind in ("kv", "inbox"):
        wait_refused(lambda: _decode_refusals(s), worker_before, kind)

    prompt = [1, 5, 9, 13, 17, 21, 25, 29, 33, 37, 41, 45, 49, 53, 57, 61, 65, 69]  # over a block: KV travels
    out = s.client.completions.create(model=MODEL, prompt=prompt, temperature=0, max_tokens=8,
                                      extra_body={"ignore_eos": True})  # fmt: skip
    assert s.app.state.router.registry.live("decode") and out.choices[0].finish_reason == "length"
    assert out.choices[0].text == _greedy_text(s, prompt)
    assert delta(refusals(), router_before, "token_stream")["malformed"] == 1  # the oversized frame was never read
    assert all(delta(_decode_refusals(s), worker_before, kind)["malformed"] == 1 for kind in ("kv", "inbox"))
    metrics = _metrics(s)
    assert 'tandem:internal_messages_refused_total{reason="unauthenticated",socket="token_stream"}' in metrics
    close_all(clients)


def _greedy_text(s, prompt_ids) -> str:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(s.model_dir).decode(hf_greedy(s.model_dir, prompt_ids, 8),
                                                              skip_special_tokens=True)  # fmt: skip


def _metrics(s) -> str:
    import httpx

    return httpx.get(f"{s.server.url}/metrics").text
