"""Losing the only prefill worker costs clients nothing: the openai client -> router -> actors on Ray, tiny llama.

One prefill and two decode workers. Twelve streaming requests arrive over about
two seconds while the prefill worker is killed with SIGKILL. Requests it held
are resumed on a decode worker that prefills them itself (`router.local_prefill`),
requests sent to it as it died fail only that attempt (the worker is suspect,
then dead once its address refuses three heartbeats), and those arriving after
go to decode directly. Every stream completes with transformers' greedy text,
none sees an error, and the survivors hold no KV block afterwards.
"""

from __future__ import annotations

import asyncio
import os
import signal

import httpx
import pytest
from transformers import AutoTokenizer

from decode_worker.worker import DecodeWorkerConfig
from prefill_worker.worker import PrefillWorkerConfig
from tests.e2e.fault_stack import fault_stack, leaked_blocks, pid_of
from tests.e2e.harness import wait_for
from tests.e2e.test_faults import FAST, PROMPTS, _args, _client, _config, _greedy_text, _stream

ARRIVAL_GAP_S = 0.17  # twelve requests over about two seconds


@pytest.fixture(scope="module")
def model(tiny_model_dirs):
    model_dir = tiny_model_dirs["llama"]
    return model_dir, AutoTokenizer.from_pretrained(model_dir)


def _fallbacks(stack) -> float:
    metrics = httpx.get(f"{stack.server.url}/metrics").text
    rows = [row for row in metrics.splitlines() if row.startswith("tandem:local_prefill_fallbacks_total{")]
    return sum(float(row.split()[-1]) for row in rows)


async def _holding(worker, at_least: int) -> int:
    while worker.in_flight < at_least:
        await asyncio.sleep(0.01)
    return worker.in_flight


def test_kill_9_the_only_prefill_worker_while_twelve_streams_arrive(ray_session, model):
    n, prompts = 24, PROMPTS[:12]
    expected = [_greedy_text(model, ids, n) for ids in prompts]
    prefill = [PrefillWorkerConfig("prefill-0", FAST)]
    decode = [DecodeWorkerConfig(f"decode-{i}", timeouts=FAST) for i in range(2)]
    with fault_stack(ray_session, _args(model[0]), _config(model[0]), prefill, decode) as stack:
        pid = pid_of(ray_session, stack.actors["prefill-0"])

        async def main():
            client, progress = _client(stack), [0] * len(prompts)
            victim = stack.registry.workers["prefill-0"]
            streams, held = [], 0
            for i, ids in enumerate(prompts):
                streams.append(asyncio.create_task(_stream(client, ids, n, progress, i)))
                await asyncio.sleep(ARRIVAL_GAP_S)
                # A tiny model prefills in milliseconds: the worker is frozen a moment first (shorter than
                # any liveness limit), so that the kill surely catches prompts on it.
                if i == 3:
                    os.kill(pid, signal.SIGSTOP)
                if i == 6:
                    held = await asyncio.wait_for(_holding(victim, 2), 60)
                    os.kill(pid, signal.SIGKILL)
            return held, await asyncio.gather(*streams, return_exceptions=True)

        held, results = asyncio.run(main())
        leaked = leaked_blocks(ray_session, stack, ["decode-0", "decode-1"])
        fallbacks = _fallbacks(stack)
        # Dead after three refused heartbeats: on a loaded host the streams can all end first (2026-11-28).
        victim = stack.registry.workers["prefill-0"]
        wait_for(lambda: not victim.alive, "the registry to count the killed prefill worker dead", 30.0)
        victim_alive = victim.alive
    assert results == [(text, "length") for text in expected]
    assert held >= 2 and leaked == 0 and not victim_alive
    assert fallbacks >= held + len(prompts) - 7  # those it held, and every request that arrived after the kill
