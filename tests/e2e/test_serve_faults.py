"""Faults on a deployment as `tandem serve` runs it, with its default timeouts (nothing shortened): a tiny model,
greedy streams open while a process is killed or stopped.

- `kill -9` of the only prefill worker while twelve streams arrive: the decode worker prefills them itself
  until the controller has the prefill worker back;
- `kill -9` of one of two decode workers: its streams resume on the other;
- `kill -9` of a tensor-parallel follower of the prefill worker: its own heartbeat shows it dead within
  seconds, its group is replaced, its requests resume;
- `kill -9` of the controller: the workers serve on, Ray restarts it and it adopts them;
- SIGSTOP of the decode worker for 8 s out of every 9, for 36 s (past the 30 s of silence that marks a
  worker dead): busy is not dead, nothing restarts.
Every stream must end with exactly transformers' greedy text and the survivors must hold no block. Each
test adds its row to the reliability table (tests/e2e/fault_stack.record, scripts/bench_faults.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
import types

import openai
import psutil
import pytest
from transformers import AutoTokenizer

from cluster.deployment import Deployment
from cluster.spec import parse_spec
from wire.codec import decode
from wire.requests import WorkerLoad
from tests.conftest import hf_greedy
from tests.e2e.fault_stack import record
from tests.e2e.harness import wait_for

PROMPTS = [[(11 * i + 7 * j) % 380 + 3 for j in range(12 + 6 * i)] for i in range(16)]  # 12 .. 102 tokens


F32 = {"dtype": "float32"}  # what the transformers reference computes in (auto may pick bf16 here)


@contextlib.contextmanager
def serving(ray_session, model_dir: str, prefill: dict | None = None, decode: dict | None = None):
    """A deployment with the defaults of `tandem serve` but for the model and a small KV cache."""
    spec = parse_spec({
        "model": model_dir, "engine": {"num_kv_blocks": 256, "max_model_len": 256},
        "router": {"port": 0, "served_model_name": "tiny"}, "prefill": {**F32, **(prefill or {})}, "decode": {**F32, **(decode or {})},
    })  # fmt: skip
    deployment = Deployment(spec)
    try:
        deployment.start()
        client = openai.AsyncOpenAI(base_url=f"{deployment.url}/v1", api_key="-", max_retries=0, timeout=600)
        yield types.SimpleNamespace(deployment=deployment, controller=deployment.controller, client=client)
    finally:
        deployment.stop()


@pytest.fixture(scope="module")
def expected(tiny_model_dirs):
    model_dir = tiny_model_dirs["llama"]
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    return lambda ids, n: tokenizer.decode(hf_greedy(model_dir, ids, n), skip_special_tokens=True)


async def _stream(client, ids, n: int, progress: list[int], i: int) -> str:
    text = ""
    chunks = await client.completions.create(model="tiny", prompt=ids, max_tokens=n, temperature=0, stream=True,
                                             extra_body={"ignore_eos": True})  # fmt: skip
    async for chunk in chunks:
        if chunk.choices and chunk.choices[0].text:
            text += chunk.choices[0].text
            progress[i] += 1
    return text


def _pid(actor) -> int:
    import ray

    return ray.get(actor.__ray_call__.remote(lambda _: os.getpid()), timeout=60)


def _restarts(s) -> int:
    return sum(w["restarts"] for pool in s.controller.status()["pools"].values() for w in pool["workers"])


def _leaked(s) -> int:
    """Once every worker is idle: the blocks they still hold."""
    import ray

    workers = [w.rank0 for w in s.controller.members()[1]]
    wait_for(lambda: all(ray.get([w.is_idle.remote() for w in workers], timeout=60)), "the workers to go idle", 120)
    loads = [decode(b, WorkerLoad) for b in ray.get([w.load.remote() for w in workers], timeout=60)]
    return sum(load.total_blocks - load.free_blocks for load in loads)


def _tally(results, wanted: list[str]) -> tuple[int, int]:
    completed = sum(1 for r, e in zip(results, wanted) if r == e)
    return completed, len(wanted) - completed


async def _streams_with_fault(s, prompts, n: int, fault, spread_s: float = 0.0, after_tokens: int = 2):
    """Open a stream per prompt (`spread_s` apart in all), run `fault()` once the first have `after_tokens`
    tokens, return every stream's text (or its exception)."""
    progress = [0] * len(prompts)

    async def one(i: int, ids):
        await asyncio.sleep(spread_s * i / len(prompts))
        return await _stream(s.client, ids, n, progress, i)

    streams = [asyncio.create_task(one(i, ids)) for i, ids in enumerate(prompts)]
    while max(progress) < after_tokens and not any(t.done() for t in streams):
        await asyncio.sleep(0.005)
    await asyncio.to_thread(fault)
    return await asyncio.gather(*streams, return_exceptions=True)


def _check(name: str, s, results, wanted, restarts: int) -> None:
    completed, lost = _tally(results, wanted)
    leaked = _leaked(s)
    record(name, len(wanted), completed, lost, leaked, restarts)
    assert (completed, lost, leaked) == (len(wanted), 0, 0), results


def test_kill_9_the_only_prefill_worker_while_streams_arrive(ray_session, tiny_model_dirs, expected):
    prompts, n = PROMPTS[:12], 24
    with serving(ray_session, tiny_model_dirs["llama"]) as s:
        (prefill,) = s.controller.pool("prefill")
        pid = _pid(prefill.rank0)
        results = asyncio.run(_streams_with_fault(s, prompts, n, lambda: os.kill(pid, signal.SIGKILL),
                                                  spread_s=2.0, after_tokens=1))  # fmt: skip
        wait_for(lambda: _restarts(s) == 1, "the prefill worker to be restarted", 180)
        _check("kill -9 the only prefill worker (12 streams arriving over 2 s)", s, results,
               [expected(p, n) for p in prompts], _restarts(s))  # fmt: skip


def test_kill_9_a_decode_worker_under_open_streams(ray_session, tiny_model_dirs, expected):
    prompts, n = PROMPTS, 48
    with serving(ray_session, tiny_model_dirs["llama"], decode={"replicas": 2}) as s:
        router = s.deployment.app.state.router.registry
        victim = {}

        def kill_the_busier():
            name = max(router.live("decode"), key=lambda w: w.in_flight).name
            victim["name"] = name
            os.kill(_pid(s.controller.workers[name].rank0), signal.SIGKILL)

        results = asyncio.run(_streams_with_fault(s, prompts, n, kill_the_busier))
        wait_for(lambda: _restarts(s) == 1, f"{victim['name']} to be restarted", 180)
        _check("kill -9 a decode worker (1 of 2, 16 open streams)", s, results, [expected(p, n) for p in prompts],
               _restarts(s))  # fmt: skip


def test_kill_9_a_tensor_parallel_follower(ray_session, tiny_model_dirs, expected):
    prompts, n = PROMPTS[:8], 24
    with serving(ray_session, tiny_model_dirs["llama"], prefill={"tensor_parallel_size": 2}) as s:
        (prefill,) = s.controller.pool("prefill")
        pid = _pid(prefill.tp.followers[0])
        results = asyncio.run(_streams_with_fault(s, prompts, n, lambda: os.kill(pid, signal.SIGKILL),
                                                  spread_s=1.0, after_tokens=1))  # fmt: skip
        # Found by its own heartbeat: a collective's timeout (600 s) would be far past this wait.
        wait_for(lambda: _restarts(s) == 1, "the prefill group to be replaced", 180)
        _check("kill -9 a tensor-parallel follower (prefill TP=2, 8 streams)", s, results,
               [expected(p, n) for p in prompts], _restarts(s))  # fmt: skip


def test_kill_9_the_controller_under_open_streams(ray_session, tiny_model_dirs, expected):
    import ray

    prompts, n = PROMPTS[:8], 32
    with serving(ray_session, tiny_model_dirs["llama"]) as s:
        pid = _pid(s.controller.handle)
        results = asyncio.run(_streams_with_fault(s, prompts, n, lambda: os.kill(pid, signal.SIGKILL)))
        wait_for(lambda: _answers(s), "the controller to be back", 120)
        assert ray.get(s.controller.handle.__ray_call__.remote(lambda _: os.getpid())) != pid
        _check("kill -9 the controller (8 open streams)", s, results, [expected(p, n) for p in prompts],
               _restarts(s))  # fmt: skip
        assert _restarts(s) == 0


def _answers(s) -> bool:
    try:
        s.controller.status()
        return True
    except Exception:
        return False


def test_a_decode_worker_stopped_8_s_of_every_9_for_36_s_is_busy_not_dead(ray_session, tiny_model_dirs, expected):
    # Four stops: longer in all than the 30 s of silence that marks a worker dead (wire.liveness), none alone.
    n, span = 16, 36.0
    # Computed before: transformers on this process's threads would starve the router that runs here too.
    texts = [expected(p, n) for p in PROMPTS]
    with serving(ray_session, tiny_model_dirs["llama"]) as s:
        (decode_worker,) = s.controller.pool("decode")
        process = psutil.Process(_pid(decode_worker.rank0))  # signals only this process, never a reused pid

        async def traffic():
            done, results, wanted, i = time.monotonic() + span, [], [], 0
            while time.monotonic() < done:  # four streams at a time, new ones as they end
                batch = range(i % 16, i % 16 + 4)
                results += await asyncio.gather(*(_stream(s.client, PROMPTS[j], n, [0], 0) for j in batch),
                                                return_exceptions=True)  # fmt: skip
                wanted += [texts[j] for j in batch]
                i += 4
            return results, wanted

        async def main():
            load = asyncio.create_task(traffic())
            end = time.monotonic() + span
            while time.monotonic() < end:
                await asyncio.to_thread(process.suspend)
                await asyncio.sleep(8)
                await asyncio.to_thread(process.resume)
                await asyncio.sleep(1)
            return await load

        try:
            results, wanted = asyncio.run(main())
        finally:
            with contextlib.suppress(psutil.NoSuchProcess):
                process.resume()
        restarts = _restarts(s)
        _check(f"SIGSTOP the decode worker 8 s of every 9 for 36 s ({len(wanted)} streams)", s, results, wanted,
               restarts)  # fmt: skip
        assert restarts == 0 and s.deployment.app.state.router.registry.workers[decode_worker.name].alive
