"""Colocated decode workers are chosen by the prompt's policy: a prefix two prompts share is computed once.

Two real decode workers (in-process, over their control sockets and the real token stream) prefill their
own prompts, as in a layout with no prefill pool; the registry's policies are the ones `tandem serve`
builds for such a layout (`make_pool_policies`).
"""

from __future__ import annotations

import asyncio

import pytest

from decode_worker.actor import DecodeActor
from decode_worker.worker import DecodeWorkerConfig
from engine import EngineArgs
from router.policy import make_pool_policies
from router.registry import WorkerRegistry
from tests.router.colocated_workers import colocated_dispatcher
from tests.router.test_dispatch import GREEDY, tokens_of

BLOCK = 16


@pytest.fixture(scope="module")
def pair(tiny_model_dirs):
    args = EngineArgs(model=tiny_model_dirs["llama"], num_kv_blocks=48, max_model_len=256, dtype="float32",
                      block_size=BLOCK)  # fmt: skip
    workers = [DecodeActor(args, DecodeWorkerConfig(f"decode-{i}"), torch_threads=None) for i in range(2)]
    yield workers
    for worker in workers:
        worker.shutdown()


def test_prompts_that_share_a_prefix_go_to_the_worker_that_cached_it(pair):
    p, q = list(range(5, 5 + 4 * BLOCK)), list(range(105, 105 + 4 * BLOCK))  # two prefixes of 4 blocks
    prompts = [("p", p + [1, 2, 3]), ("q", q + [4, 5, 6]), ("q", q + [7, 8, 9]), ("p", p + [10, 11, 12])]

    async def main():
        registry = WorkerRegistry(*make_pool_policies("cache_aware", {"block_size": BLOCK}, BLOCK, colocated=True))
        chosen: dict[str, list[str]] = {}
        async with colocated_dispatcher(registry, pair) as dispatcher:
            for prefix, prompt in prompts:
                gen = await dispatcher.start(prompt, GREEDY)
                chosen.setdefault(prefix, []).append(gen.decode.name)
                tokens, _ = await tokens_of(gen)
                assert len(tokens) == GREEDY.max_tokens
        return chosen

    chosen = asyncio.run(main())
    assert len(set(chosen["p"])) == 1 and len(set(chosen["q"])) == 1 and chosen["p"][0] != chosen["q"][0]
    for worker in pair:  # each computed its prefix once and found it cached the second time
        assert worker.hosted.worker.engine.kv_cache.pool.num_cache_hits >= 4
