"""Admission by predicted time to first token, over HTTP: the router on loopback, a prefill and a decode
actor on Ray. With a deadline the flood cannot meet, the requests beyond it get a 429 in OpenAI's error
format with a Retry-After, the rest complete, and the workers end holding nothing."""

from __future__ import annotations

import asyncio

import httpx

from engine import EngineArgs
from router.config import RouterConfig
from tests.e2e.harness import PROMPTS, wait_for
from tests.e2e.router_cluster import router_on_ray

MODEL = "tiny-llama"
PROMPT = (PROMPTS["long"] * 3)[:200]


async def _flood(url: str, count: int) -> list[httpx.Response]:
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 4, "temperature": 0, "ignore_eos": True}
    async with httpx.AsyncClient(base_url=url, timeout=120) as client:
        return await asyncio.gather(*(client.post("/v1/completions", json=body) for _ in range(count)))


def test_a_flood_beyond_the_predicted_ttft_deadline_is_refused_at_once_and_the_rest_served(ray_session,
                                                                                           tiny_model_dirs):
    import ray

    model_dir = tiny_model_dirs["llama"]
    args = EngineArgs(model=model_dir, num_kv_blocks=64, max_model_len=256, dtype="float32")
    config = RouterConfig(model_dir, MODEL, max_model_len=256, load_refresh_s=0.1)
    with router_on_ray(ray_session, args, config) as stack:
        url, registry = stack.server.url, stack.app.state.router.registry
        warm = asyncio.run(_flood(url, 3))  # the default deadline (60 s): nothing near it
        assert [r.status_code for r in warm] == [200, 200, 200]
        # The rate the flood will be judged by: one read while the warm-up's steps were still being reported
        # could be several times off the settled one (a step slowed by the CI's other tests), and the flood
        # all refused or all served.
        prompt_rate = registry.workers["prefill-0"].prompt_rate
        wait_for(lambda: prompt_rate.settled and prompt_rate.tokens_per_s, "a settled prompt rate")
        # A deadline four prompts long at that rate: the first requests of a flood of 40 fit, the rest not.
        stack.app.state.router.dispatcher.ttft_deadline_s = 4 * len(PROMPT) / prompt_rate.tokens_per_s
        responses = asyncio.run(_flood(url, 40))
        statuses = [r.status_code for r in responses]
        assert set(statuses) == {200, 429}, statuses
        for refused in (r for r in responses if r.status_code == 429):
            assert int(refused.headers["Retry-After"]) >= 1
            assert refused.json()["error"]["code"] == "too_many_requests"
            assert "predicted" in refused.json()["error"]["message"]
        assert all(r.json()["usage"]["completion_tokens"] == 4 for r in responses if r.status_code == 200)
        wait_for(lambda: all(ray.get([a.is_idle.remote() for a in stack.actors])), "the workers to go idle")
        assert [w.prompt_tokens_queued for w in registry.workers.values()] == [0, 0]
