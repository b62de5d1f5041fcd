"""Conditional disaggregation in the dispatcher: no prefill worker able to take a request -> decode prefills it.

The routing decisions are checked with fake endpoints that record the calls
they get (a real token stream, no tokens); the outputs with a real decode
actor in-process over its control socket, whose greedy text must equal
transformers' when it prefilled the prompt itself, also for a request caught
on a prefill worker that died.
"""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from decode_worker.actor import DecodeActor
from decode_worker.worker import DecodeWorkerConfig
from engine import EngineArgs
from router.control_client import WorkerGone
from wire.requests import DecodeReservation, SamplingSpec, WorkerLoad
from router.dispatch import Dispatcher
from router.local_prefill import NO_PREFILL_WORKER, PREFILL_BACKLOG, PREFILL_SUSPECT, LocalPrefillRule
from router.policy import make_policy
from router.registry import WorkerRegistry
from router.token_stream import TokenStreamConsumer
from tests.conftest import hf_greedy
from tests.e2e.harness import PROMPTS, wait_for
from tests.router.test_dispatch import _local, tokens_of

GREEDY = SamplingSpec(temperature=0.0, max_tokens=12, ignore_eos=True)


class FakeDecode:
    """Reserves whatever it is asked (local when the request says so), records reserves and aborts."""

    def __init__(self):
        self.reserved, self.aborted = [], []

    async def reserve(self, request):
        self.reserved.append(request)
        if request.local_prefill:
            return DecodeReservation(request.request_id, prefill_locally=True)
        return DecodeReservation(request.request_id, False, "tcp://127.0.0.1:9", "tcp://127.0.0.1:9", (0, 1))

    async def abort(self, request_id):
        self.aborted.append(request_id)

    async def load(self):
        return WorkerLoad("decode", 0, 0, 0, 40, 40, 0.0)


class FakePrefill:
    """Takes prefill tasks and holds them (computes nothing), or fails every call with `error`."""

    def __init__(self, error: Exception | None = None):
        self.tasks, self.aborted, self.error = [], [], error

    async def prefill(self, task):
        if self.error is not None:
            raise self.error
        self.tasks.append(task)

    async def abort(self, request_id):
        if self.error is not None:
            raise self.error
        self.aborted.append(request_id)

    async def load(self):
        return WorkerLoad("prefill", 0, 0, 0, 40, 40, 0.0)


@contextlib.asynccontextmanager
async def _dispatching(decode, prefill=None):
    """(dispatcher, registry, fallback reasons) over `decode` and, if given, `prefill` on a live token stream."""
    registry = WorkerRegistry(make_policy("round_robin"))
    registry.register("decode-0", "decode", decode)
    if prefill is not None:
        registry.register("prefill-0", "prefill", prefill)
    stream = TokenStreamConsumer()
    await stream.start()
    reasons: list[str] = []
    dispatcher = Dispatcher(registry, stream, local_prefill=LocalPrefillRule(), on_local_prefill=reasons.append)
    try:
        yield dispatcher, registry, reasons
        await dispatcher.drain_aborts()
    finally:
        await stream.close()


def _prepare(registry: WorkerRegistry, situation: str) -> None:
    """Put the prefill pool into `situation` (see the parametrization below)."""
    prefill, decode = registry.workers.get("prefill-0"), registry.workers["decode-0"]
    if situation == "draining":
        registry.drain("prefill-0")
    elif situation == "suspect":
        registry.mark_suspect("prefill-0", "a call to it failed")
    elif situation.startswith("queue"):  # "queue P/D": P prompts pending on prefill, D requests on decode
        prefill_pending, decode_pending = map(int, situation.split()[1].split("/"))
        prefill.load = WorkerLoad("prefill-0", prefill_pending, 0, 0, 40, 40, 0.0)
        decode.load = WorkerLoad("decode-0", 0, decode_pending, 0, 40, 40, 0.0)


@pytest.mark.parametrize(
    ("situation", "reason"),
    [("no prefill worker", NO_PREFILL_WORKER), ("draining", NO_PREFILL_WORKER), ("suspect", PREFILL_SUSPECT),
     ("queue 20/0", PREFILL_BACKLOG), ("queue 8/1", PREFILL_BACKLOG),
     ("queue 3/0", None), ("queue 8/2", None), ("healthy", None)],
)  # fmt: skip
def test_decode_prefills_when_no_prefill_worker_can_take_the_request(situation, reason):
    decode, prefill = FakeDecode(), FakePrefill()

    async def main():
        async with _dispatching(decode, None if situation == "no prefill worker" else prefill) as (d, registry, why):
            _prepare(registry, situation)
            gen = await d.start(PROMPTS["mid"], GREEDY)
            gen.close()
            return gen, why

    gen, reasons = asyncio.run(main())
    (request,) = decode.reserved
    if reason is None:  # disaggregated as usual
        assert not request.local_prefill and len(prefill.tasks) == 1 and reasons == []
    else:
        assert request.local_prefill and prefill.tasks == [] and reasons == [reason]
    assert gen.resumes == 0


def test_a_prefill_call_that_fails_is_resumed_with_local_prefill_and_the_worker_stays_in_the_pool():
    decode, prefill = FakeDecode(), FakePrefill(WorkerGone("the control connection dropped"))

    async def main():
        async with _dispatching(decode, prefill) as (dispatcher, registry, reasons):
            gen = await dispatcher.start(PROMPTS["mid"], GREEDY)
            gen.close()
            return gen, registry.workers["prefill-0"], reasons

    gen, prefill_state, reasons = asyncio.run(main())
    first, resumed = decode.reserved
    assert (first.local_prefill, resumed.local_prefill, gen.resumes) == (False, True, 1)
    assert first.request_id in decode.aborted  # the failed attempt's reservation was given back
    assert prefill_state.alive and prefill_state.suspect and reasons == [PREFILL_SUSPECT]


# ---- with a real decode worker ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def decode_actor(tiny_model_dirs):
    args = EngineArgs(model=tiny_model_dirs["llama"], num_kv_blocks=48, max_model_len=256, dtype="float32")
    actor = DecodeActor(args, DecodeWorkerConfig("decode-0"), torch_threads=None)  # never prefills on its own
    yield actor
    actor.shutdown()


def _free(actor) -> bool:
    return actor.is_idle() and actor.pool_all_free()


def test_with_no_prefill_worker_decode_prefills_and_the_output_is_greedy(decode_actor, tiny_model_dirs):
    async def main():
        async with _dispatching(_local(decode_actor)) as (dispatcher, _, reasons):
            results = await asyncio.gather(*(_run(dispatcher, PROMPTS[name]) for name in ("mid", "long")))
            return results, reasons

    async def _run(dispatcher, prompt):
        return await tokens_of(await dispatcher.start(prompt, GREEDY))

    results, reasons = asyncio.run(main())
    for (tokens, final), name in zip(results, ("mid", "long")):
        assert tokens == hf_greedy(tiny_model_dirs["llama"], PROMPTS[name], 12) and final.finish_reason == "length"
    assert reasons == [NO_PREFILL_WORKER] * 2
    wait_for(lambda: _free(decode_actor), "decode to free every block")


def test_a_request_caught_on_a_prefill_worker_that_dies_resumes_with_local_prefill(decode_actor, tiny_model_dirs):
    """The prefill worker took the prompt and died before its first token: the request resumes on decode,
    which prefills it itself; the client's tokens are transformers' greedy ones."""
    holding = FakePrefill()
    prompt = PROMPTS["long"]

    async def main():
        async with _dispatching(_local(decode_actor), holding) as (dispatcher, registry, reasons):
            gen = await dispatcher.start(prompt, GREEDY)
            assert gen.prefill is registry.workers["prefill-0"] and len(holding.tasks) == 1
            registry.mark_dead("prefill-0", "killed by the test")  # as the liveness verdict does
            tokens, final = await tokens_of(gen)
            return gen, tokens, final, reasons

    gen, tokens, final, reasons = asyncio.run(main())
    assert gen.resumes == 1 and reasons == [NO_PREFILL_WORKER]
    assert tokens == hf_greedy(tiny_model_dirs["llama"], prompt, 12) and final.num_output_tokens == 12
    wait_for(lambda: _free(decode_actor), "decode to free the first attempt's reservation and the request")
