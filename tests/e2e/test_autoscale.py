"""The autoscaler through the real path: the controller actor grows and shrinks pools from the router's numbers.

Targets chosen so the outcome is certain: prefill's mean-TTFT target is a
microsecond (any served request is above it: grow 1 -> 2), decode has two
workers and no load (every signal below half its target: shrink 2 -> 1).
Requests keep flowing meanwhile and must all come back right.
"""

from __future__ import annotations

import threading

import openai
import pytest

from cluster.deployment import Deployment
from cluster.spec import parse_spec
from tests.e2e.harness import wait_for
from tests.e2e.leftovers import left_behind

PROMPT = [5, 17, 42, 99, 7, 64, 3, 250, 11]


@pytest.fixture(scope="module")
def deployment(ray_session, tiny_model_dirs):
    spec = parse_spec({
        "model": tiny_model_dirs["llama"],
        "engine": {"num_kv_blocks": 48, "max_model_len": 256},
        "router": {"port": 0, "served_model_name": "tiny"},
        "prefill": {"dtype": "float32"},
        "decode": {"replicas": 2, "dtype": "float32"},
        "health": {"interval_s": 0.5},
        "autoscale": {"enabled": True, "interval_s": 0.3, "cooldown_s": 600,
                      "prefill": {"min_replicas": 1, "max_replicas": 2, "max_latency_s": 1e-6},
                      "decode": {"min_replicas": 1, "max_replicas": 2}},
    })  # fmt: skip
    deployment = Deployment(spec)
    try:
        deployment.start()
        yield deployment
    finally:
        deployment.stop()
    assert left_behind(deployment.namespace) == []  # its workers are detached: stop kills them all the same


def test_pools_grow_and_shrink_on_the_routers_numbers_while_serving(deployment):
    client = openai.OpenAI(base_url=f"{deployment.url}/v1", api_key="unused", max_retries=0, timeout=60)
    results, stop = [], threading.Event()

    def client_loop():
        while not stop.is_set():
            try:
                results.append(client.completions.create(model="tiny", prompt=PROMPT, max_tokens=4, temperature=0,
                                                         extra_body={"ignore_eos": True}).choices[0].text)  # fmt: skip
            except Exception as err:  # every failure is counted, none hidden
                results.append(err)

    thread = threading.Thread(target=client_loop)
    thread.start()
    try:
        wait_for(lambda: _pool_sizes(deployment) == (2, 1), "prefill 1 -> 2 and decode 2 -> 1", timeout_s=180)
        seen = len(results)
        wait_for(lambda: len(results) >= seen + 2, "requests on the resized pools")
    finally:
        stop.set()
        thread.join(60)
    assert not [r for r in results if isinstance(r, Exception)]
    assert len(set(results)) == 1  # greedy: the same text from every worker
    events = " | ".join(deployment.controller.status()["events"])
    assert "autoscale:" in events and "prefill 1 -> 2" in events and "decode 2 -> 1" in events


def _pool_sizes(deployment) -> tuple[int, int]:
    pools = deployment.controller.status()["pools"]
    return tuple(len([w for w in pools[role]["workers"] if w["alive"]]) for role in ("prefill", "decode"))
