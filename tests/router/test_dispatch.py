"""The dispatch layer on an event loop with real workers (prefill and decode actors built in-process, no Ray).

Calls cross each actor's real control socket (`control_endpoint`, as the cluster registers
workers), tokens come back over the real ZMQ token stream; outputs equal transformers' greedy generate.
"""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from decode_worker.actor import DecodeActor
from decode_worker.worker import DecodeWorkerConfig
from engine import EngineArgs
from router.control_client import control_endpoint
from wire.requests import SamplingSpec
from prefill_worker.actor import PrefillActor
from prefill_worker.worker import PrefillWorkerConfig
from router.dispatch import Dispatcher
from router.policy import make_policy
from router.registry import NoLiveWorker, WorkerRegistry
from router.token_stream import TokenStreamConsumer
from router.ttft_prediction import FirstTokenTooLate
from tests.conftest import hf_greedy
from tests.e2e.harness import PROMPTS, wait_for

GREEDY = SamplingSpec(temperature=0.0, max_tokens=8, ignore_eos=True)


def _local(actor):
    """An actor object in this process, called over its control socket."""
    return control_endpoint(actor.control_address())


@pytest.fixture(scope="module")
def actors(tiny_model_dirs):
    args = EngineArgs(model=tiny_model_dirs["llama"], num_kv_blocks=48, max_model_len=256, dtype="float32")
    prefill = PrefillActor(args, PrefillWorkerConfig("prefill-0"), torch_threads=None)
    decode = DecodeActor(args, DecodeWorkerConfig("decode-0"), torch_threads=None)
    yield prefill, decode
    for actor in (prefill, decode):
        actor.shutdown()


@contextlib.asynccontextmanager
async def _dispatcher(prefill, decode):
    registry = WorkerRegistry(make_policy("round_robin"))
    registry.register("prefill-0", "prefill", _local(prefill))
    registry.register("decode-0", "decode", _local(decode))
    stream = TokenStreamConsumer()
    await stream.start()
    try:
        yield Dispatcher(registry, stream), registry
    finally:
        await stream.close()


async def _run(dispatcher: Dispatcher, prompt, sampling=GREEDY):
    return await tokens_of(await dispatcher.start(prompt, sampling))


async def tokens_of(gen) -> tuple[list[int], object]:
    """Every token of a started generation and its final delta; the generation is closed either way."""
    tokens, final = [], None
    try:
        async for chunk in gen.chunks():
            tokens += chunk.token_ids
            final = chunk.final or final
    finally:
        gen.close()
    return tokens, final


def _all_free(*actors) -> bool:
    return all(a.is_idle() and a.pool_all_free() for a in actors)


def test_concurrent_requests_match_transformers_and_give_back_their_load(actors, tiny_model_dirs):
    async def main():
        async with _dispatcher(*actors) as (dispatcher, registry):
            results = await asyncio.gather(*(_run(dispatcher, p) for p in PROMPTS.values()))
            await registry.refresh_loads(10.0)
            return results, registry

    results, registry = asyncio.run(main())
    for (tokens, final), prompt in zip(results, PROMPTS.values()):
        assert tokens == hf_greedy(tiny_model_dirs["llama"], prompt, 8)
        assert (final.finish_reason, final.num_prompt_tokens, final.num_output_tokens) == ("length", len(prompt), 8)
    assert [w.in_flight for w in registry.workers.values()] == [0, 0]
    assert [w.prompt_tokens_queued for w in registry.workers.values()] == [0, 0]  # every charge given back
    assert registry.workers["decode-0"].load.total_blocks == 48
    wait_for(lambda: _all_free(*actors), "both pools to be free")


def test_a_prompt_predicted_to_start_too_late_is_refused_holding_nothing(actors):
    """The prefill worker's measured rate and the prompts charged to it predict TTFT; beyond the deadline
    `start` raises before anything is sent."""

    async def main():
        async with _dispatcher(*actors) as (dispatcher, registry):
            await _run(dispatcher, PROMPTS["long"])
            await registry.refresh_loads(10.0)
            assert registry.workers["prefill-0"].prompt_rate.tokens_per_s > 0  # measured by the worker itself
            dispatcher.ttft_deadline_s = 1e-9
            with pytest.raises(FirstTokenTooLate):
                await dispatcher.start(PROMPTS["long"], GREEDY)
            held = [(w.in_flight, w.prompt_tokens_queued) for w in registry.workers.values()]
            dispatcher.ttft_deadline_s = 3600.0
            tokens, _ = await _run(dispatcher, PROMPTS["long"])
            return held, tokens

    held, tokens = asyncio.run(main())
    assert held == [(0, 0), (0, 0)] and len(tokens) == 8


def test_closing_an_unfinished_generation_aborts_it_on_both_workers(actors):
    long_run = SamplingSpec(temperature=0.0, max_tokens=150, ignore_eos=True)

    async def main():
        async with _dispatcher(*actors) as (dispatcher, registry):
            gen = await dispatcher.start(PROMPTS["long"], long_run)
            async for chunk in gen.chunks():
                assert chunk.final is None
                break
            gen.close()
            assert [w.in_flight for w in registry.workers.values()] == [0, 0]
            await dispatcher.drain_aborts()
            # The abort was awaited, so decode dropped the request; its board shows that after the
            # round that took the abort (one step at most), well before the 150 tokens are done.
            for _ in range(100):
                if actors[1].is_idle():
                    return True
                await asyncio.sleep(0.01)
            return False

    assert asyncio.run(main())
    wait_for(lambda: _all_free(*actors), "both pools to be free")


def test_a_failing_prefill_worker_is_suspect_not_dead_and_decode_serves_its_requests(actors, tiny_model_dirs):
    args = EngineArgs(model=tiny_model_dirs["llama"], num_kv_blocks=48, max_model_len=256, dtype="float32")
    stopped = PrefillActor(args, PrefillWorkerConfig("prefill-gone"), torch_threads=None)

    async def main():
        async with _dispatcher(*actors) as (dispatcher, registry):
            registry.unregister("prefill-0")
            registry.register("prefill-gone", "prefill", _local(stopped))
            await registry.workers["prefill-gone"].endpoint.load()  # connected ...
            stopped.shutdown()  # ... then its socket closes: every call now fails, as a dying worker's would
            first = await _run(dispatcher, PROMPTS["mid"])  # its prefill call fails: resumed, decode prefills
            gone = registry.workers["prefill-gone"]
            assert gone.alive and gone.suspect  # one failed call is no death: only its heartbeats can tell
            second = await _run(dispatcher, PROMPTS["mid"])  # the suspect worker is not tried again
            await dispatcher.drain_aborts()
            return first, second, registry

    first, second, registry = asyncio.run(main())
    expected = hf_greedy(tiny_model_dirs["llama"], PROMPTS["mid"], 8)
    assert first[0] == second[0] == expected
    assert registry.workers["decode-0"].in_flight == registry.workers["prefill-gone"].in_flight == 0
    wait_for(lambda: _all_free(*actors), "decode to free the aborted reservation")


def test_a_draining_worker_finishes_what_it_holds_and_gets_nothing_new(actors, tiny_model_dirs):
    async def main():
        async with _dispatcher(*actors) as (dispatcher, registry):
            held = asyncio.create_task(_run(dispatcher, PROMPTS["long"]))
            await asyncio.sleep(0)  # dispatched: both workers count it
            assert [w.in_flight for w in registry.workers.values()] == [1, 1]
            registry.drain("decode-0")
            with pytest.raises(NoLiveWorker, match="decode"):
                await dispatcher.start(PROMPTS["mid"], GREEDY)
            tokens, final = await held
            assert registry.workers["decode-0"].alive and registry.workers["decode-0"].in_flight == 0
            return tokens, final

    tokens, final = asyncio.run(main())
    assert tokens == hf_greedy(tiny_model_dirs["llama"], PROMPTS["long"], 8) and final.finish_reason == "length"
    wait_for(lambda: _all_free(*actors), "both pools to be free")
