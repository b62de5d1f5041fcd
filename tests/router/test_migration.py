"""Request migration and the watchdog in the dispatcher, with real workers in-process (no Ray).

A decode worker is taken out as the load refresh does it (marked dead, then
its loop stops: every call to it raises): its request continues on the other
decode worker, the client's tokens equal transformers' greedy generate with
no duplicate and no gap, and the usage counts the whole request.
"""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from decode_worker.actor import DecodeActor
from decode_worker.worker import DecodeWorkerConfig
from engine import EngineArgs
from wire.requests import GenerateRequest, SamplingSpec
from prefill_worker.actor import PrefillActor
from prefill_worker.worker import PrefillWorkerConfig
from router.dispatch import Dispatcher
from router.migration import resumed_request
from router.policy import make_policy
from router.registry import WorkerRegistry
from router.token_stream import StreamFailed, TokenStreamConsumer
from router.watchdog import RequestTimedOut, resume_silent_requests
from tests.conftest import hf_greedy
from tests.e2e.harness import PROMPTS, wait_for
from tests.router.test_dispatch import _local

LONG = SamplingSpec(temperature=0.0, max_tokens=40, ignore_eos=True)


@pytest.fixture(scope="module")
def engine_args(tiny_model_dirs):
    return EngineArgs(model=tiny_model_dirs["llama"], num_kv_blocks=48, max_model_len=256, dtype="float32")


@pytest.fixture(scope="module")
def survivors(engine_args):
    prefill = PrefillActor(engine_args, PrefillWorkerConfig("prefill-0"), torch_threads=None)
    decode = DecodeActor(engine_args, DecodeWorkerConfig("decode-1"), torch_threads=None)
    yield prefill, decode
    for actor in (prefill, decode):
        actor.shutdown()


@contextlib.asynccontextmanager
async def _dispatching(prefill, *decodes):
    """A dispatcher over these workers (decode workers registered by their names) on a live token stream."""
    registry = WorkerRegistry(make_policy("round_robin"))
    registry.register("prefill-0", "prefill", _local(prefill))
    for actor in decodes:
        registry.register(actor.name, "decode", _local(actor))
    stream = TokenStreamConsumer()
    await stream.start()
    dispatcher = Dispatcher(registry, stream)
    try:
        yield dispatcher, registry
        await dispatcher.drain_aborts()
    finally:
        await stream.close()


async def _tokens_until(gen, n: int, tokens: list[int]):
    async for chunk in gen.chunks():
        tokens += chunk.token_ids
        if chunk.final is not None or len(tokens) >= n:
            return chunk.final


def test_resumed_request_continues_after_the_delivered_tokens():
    original = GenerateRequest("r-1", (1, 2, 3), SamplingSpec(max_tokens=10, min_tokens=4, seed=7), "tcp://x")
    resumed = resumed_request(original, [9, 8, 7], attempt=2)
    assert resumed.request_id == "r-1.2" and resumed.prompt_token_ids == (1, 2, 3, 9, 8, 7)
    assert (resumed.sampling.max_tokens, resumed.sampling.min_tokens, resumed.sampling.seed) == (7, 1, 7)
    assert resumed.sampling.resumed_output_tokens == 3  # a grammar continues after them
    assert resumed_request(original, list(range(10)), attempt=1) is None


def test_a_dead_decode_workers_request_resumes_on_the_other_with_greedy_output(engine_args, survivors, tiny_model_dirs):
    prefill, decode = survivors
    doomed = DecodeActor(engine_args, DecodeWorkerConfig("decode-0"), torch_threads=None)
    prompt = PROMPTS["long"]

    async def main():
        async with _dispatching(prefill, doomed, decode) as (dispatcher, registry):
            registry.drain("decode-1")  # the request starts on decode-0 ...
            gen = await dispatcher.start(prompt, LONG)
            registry.workers["decode-1"].draining = False  # ... and may move to decode-1
            tokens: list[int] = []
            await _tokens_until(gen, 5, tokens)
            registry.mark_dead("decode-0", "killed by the test")  # as a failed load() does
            doomed.shutdown()
            final = await _tokens_until(gen, 10**6, tokens)
            gen.close()
        return gen, tokens, final, registry

    gen, tokens, final, registry = asyncio.run(main())
    assert gen.resumes == 1 and gen.decode.name == "decode-1"
    assert tokens == hf_greedy(tiny_model_dirs["llama"], prompt, 40)
    assert (final.finish_reason, final.num_prompt_tokens, final.num_output_tokens) == ("length", len(prompt), 40)
    assert [w.in_flight for w in registry.live("decode") + registry.live("prefill")] == [0, 0]
    wait_for(lambda: all(a.is_idle() and a.pool_all_free() for a in survivors), "the survivors to be free")


def test_with_no_decode_worker_left_the_stream_fails_at_once(engine_args, survivors):
    prefill, _ = survivors
    doomed = DecodeActor(engine_args, DecodeWorkerConfig("decode-0"), torch_threads=None)

    async def main():
        async with _dispatching(prefill, doomed) as (dispatcher, registry):
            gen = await dispatcher.start(PROMPTS["mid"], LONG)
            await _tokens_until(gen, 2, [])
            registry.mark_dead("decode-0", "killed by the test")
            doomed.shutdown()
            with pytest.raises(StreamFailed, match="no decode worker is alive"):
                await _tokens_until(gen, 10**6, [])
            gen.close()

    asyncio.run(main())
    wait_for(lambda: survivors[0].is_idle() and survivors[0].pool_all_free(), "prefill to be free")


def test_the_watchdog_resumes_a_silent_request_and_ends_it_once_its_resumes_are_spent(survivors, tiny_model_dirs):
    prefill, decode = survivors
    prompt = PROMPTS["long"]

    async def main():
        async with _dispatching(prefill, decode) as (dispatcher, _):
            dispatcher.max_resumes = 1
            gen = await dispatcher.start(prompt, LONG)
            tokens: list[int] = []
            await _tokens_until(gen, 3, tokens)
            assert resume_silent_requests(dispatcher, 60.0, now=gen.outputs.last_activity + 3600) == [gen.request_id]
            final = await _tokens_until(gen, 10**6, tokens)  # moved, not failed: the client sees every token
            assert gen.resumes == 1
            gen2 = await dispatcher.start(prompt, LONG)
            await _tokens_until(gen2, 1, [])
            gen2.resumes = dispatcher.max_resumes  # as if it had been resumed already
            resume_silent_requests(dispatcher, 60.0, now=gen2.outputs.last_activity + 3600)
            with pytest.raises(RequestTimedOut, match="no token for 60s"):
                await _tokens_until(gen2, 10**6, [])
            gen.close()
            gen2.close()
        return tokens, final

    tokens, final = asyncio.run(main())
    assert tokens == hf_greedy(tiny_model_dirs["llama"], prompt, 40) and final.finish_reason == "length"
    wait_for(lambda: all(a.is_idle() and a.pool_all_free() for a in survivors), "the workers to be free")
