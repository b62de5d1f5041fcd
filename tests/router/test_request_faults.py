"""A request that makes every worker's step fail is that request's 400, not a fault of worker after worker.

Two real decode workers (in-process, over their control sockets and the real token stream) prefill and
decode themselves; their model runs fail any step whose batch holds the poison tokens, as a kernel bug
triggered by one input would. The first failure is taken for the worker's (the request moves on); the
second ends the request, and both workers keep serving.
"""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from cluster.spec import HealthSpec
from decode_worker.actor import DecodeActor
from decode_worker.worker import DecodeWorkerConfig
from engine import EngineArgs
from router.dispatch import RequestFailedSteps
from router.errors import from_dispatch
from router.policy import make_policy
from router.registry import WorkerRegistry
from tests.e2e.harness import wait_for
from tests.router.colocated_workers import colocated_dispatcher
from tests.router.test_dispatch import GREEDY, tokens_of

POISON = [13, 13, 13]  # three in a row: only a prompt has them (decode steps here hold one token per row)


@pytest.fixture(scope="module")
def poisoned(tiny_model_dirs):
    args = EngineArgs(model=tiny_model_dirs["llama"], num_kv_blocks=48, max_model_len=256, dtype="float32")
    workers = [DecodeActor(args, DecodeWorkerConfig(f"decode-{i}"), torch_threads=None) for i in range(2)]
    for worker in workers:
        runner = worker.hosted.worker.engine.runner
        real_execute = runner.execute

        def execute(batch, *args, real_execute=real_execute, **kwargs):
            if POISON in [batch.input_ids[i : i + 3].tolist() for i in range(len(batch.input_ids) - 2)]:
                raise RuntimeError("a kernel failed on this input")
            return real_execute(batch, *args, **kwargs)

        runner.execute = execute
    yield workers
    for worker in workers:
        worker.shutdown()


def test_a_request_that_fails_the_steps_of_two_workers_is_its_own_400(poisoned):
    async def main():
        registry = WorkerRegistry(make_policy("round_robin"))
        async with colocated_dispatcher(registry, poisoned) as dispatcher:
            with pytest.raises(RequestFailedSteps) as failed:
                await tokens_of(await dispatcher.start([5, *POISON, 7], GREEDY))
            for worker in poisoned:
                wait_for(worker.is_idle, f"{worker.name} idle", 30)
            counted = sorted(worker.board.failed_in_a_row for worker in poisoned)
            fine = [await tokens_of(await dispatcher.start([5, 6, 7 + i], GREEDY)) for i in range(2)]
            await dispatcher.drain_aborts()
            return failed.value, counted, fine, {w.name for w in registry.pickable("decode")}

    failure, counted, fine, pickable = asyncio.run(main())
    error = from_dispatch(failure)
    assert error.status == 400 and error.code == "request_failed_steps" and "2 attempts" in error.message
    # Its first worker counts the failure (alone and new: nothing tells it from a device error); the second knows
    # the request failed a step before (`GenerateRequest.suspect`), so its lone failure is the request's.
    assert counted == [0, 1]
    assert [len(tokens) for tokens, _ in fine] == [GREEDY.max_tokens] * 2
    assert pickable == {"decode-0", "decode-1"}  # both still serve
    for worker in poisoned:  # one failed step each (of 3 in a row that mean dead), nothing left held
        assert worker.board.failed_in_a_row <= 1
        # The board is the worker loop's to update after it sent a final delta: a loaded machine may read it first.
        wait_for(lambda: worker.is_idle() and worker.pool_all_free(), f"{worker.name} idle, every block free", 30)


async def _a_stream_beside_poisons(dispatcher, stream_prompt: list[int], max_tokens: int, poisons: list[list[int]]):
    """A stream of `max_tokens` decoding when the `poisons` arrive (their prefill joins its steps): its tokens,
    and each poison's outcome (its tokens, or the exception that ended it)."""
    beside = await dispatcher.start(stream_prompt, dataclasses.replace(GREEDY, max_tokens=max_tokens))
    chunks = beside.chunks()
    tokens = list((await chunks.__anext__()).token_ids)
    started = [asyncio.create_task(tokens_of(await dispatcher.start(p, GREEDY))) for p in poisons]
    async for chunk in chunks:
        tokens += chunk.token_ids
    beside.close()
    return tokens, await asyncio.gather(*started, return_exceptions=True)


def test_a_request_beside_the_poison_is_not_blamed_for_its_failed_steps(poisoned):
    """One worker: a stream decoding when the poison arrives shares the poison's failed step. The worker then
    runs each alone: the poison fails alone (its own 400, on its retry too), the stream goes on unharmed."""
    worker = poisoned[0]

    async def main():
        registry = WorkerRegistry(make_policy("round_robin"))
        async with colocated_dispatcher(registry, [worker]) as dispatcher:
            tokens, (poison,) = await _a_stream_beside_poisons(dispatcher, [5, 6, 8], 40, [[5, *POISON, 7]])
            alone = await tokens_of(await dispatcher.start([5, 6, 8], dataclasses.replace(GREEDY, max_tokens=40)))
            await dispatcher.drain_aborts()
            return tokens, poison, alone[0]

    tokens, poison, alone = asyncio.run(main())
    assert isinstance(poison, RequestFailedSteps)
    assert tokens == alone and len(tokens) == 40  # the same tokens as with no poison around
    wait_for(lambda: worker.is_idle() and worker.pool_all_free(), f"{worker.name} idle, every block free", 30)


def test_two_poisons_in_one_batch_are_theirs_not_a_worker_failing_every_step(poisoned):
    """Two poison prompts join a stream's steps at once: the batch fails, then each poison fails alone. Those
    lone failures are the requests', not the worker's: it is not taken for a worker whose steps all fail
    (3 in a row), and the stream goes on."""
    worker = poisoned[0]

    async def main():
        registry = WorkerRegistry(make_policy("round_robin"))
        async with colocated_dispatcher(registry, [worker]) as dispatcher:
            poisons = [[p, *POISON, 7] for p in (4, 5)]
            tokens, failures = await _a_stream_beside_poisons(dispatcher, [5, 6, 9], 30, poisons)
            await dispatcher.drain_aborts()
            return tokens, failures, {w.name for w in registry.pickable("decode")}

    tokens, failures, pickable = asyncio.run(main())
    assert len(tokens) == 30 and all(isinstance(f, RequestFailedSteps) for f in failures)
    # Not taken for dead (3 failed steps in a row): their batch counts one (0 once the stream's next step
    # sampled); their resumed attempts come marked suspect, each runs alone, and those failures are theirs.
    assert worker.board.failed_in_a_row <= 1 < HealthSpec().max_failed_steps and pickable == {worker.name}
    wait_for(lambda: worker.is_idle() and worker.pool_all_free(), f"{worker.name} idle, every block free", 30)
