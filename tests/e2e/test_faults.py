"""Fault injection end to end: the openai client -> router -> prefill and decode actors on Ray, tiny llama.

- `kill -9` of a decode worker while 16 streams are open on 2 decode workers:
  every stream completes with transformers' greedy text (the requests resume
  on the survivor, re-prefilling the prompt plus the tokens already streamed).
- `kill -9` of one of 2 prefill workers while prompts queue on it: every
  request completes (re-routed, or recomputed by decode when its KV was cut off).
- every step of a decode worker fails (a sticky device error): its streams move
  to the other worker, and its heartbeats soon take it out of the pool.
- KV chunks dropped or delayed past the receiver's deadline (the sender's
  test-only transport faults): `recompute` completes every request with the
  greedy text, `fail` answers each with a clear error.
After each, every surviving worker holds no block. Each test adds a row to the
reliability table (tests/e2e/fault_stack.record, scripts/bench_faults.py).
"""

from __future__ import annotations

import asyncio
import dataclasses
import time

import openai
import pytest
from transformers import AutoTokenizer

from decode_worker.worker import DecodeWorkerConfig
from engine import EngineArgs
from kvtransfer.connector import TransferTimeouts
from kvtransfer.faults import TransportFaults
from prefill_worker.worker import PrefillWorkerConfig
from router.config import RouterConfig
from tests.conftest import hf_greedy
from tests.e2e.fault_stack import fault_stack, kill_9, leaked_blocks, record

MODEL = "tiny-llama"
# A dead peer is noticed within seconds (defaults: 5 s lease and silence); KV-fault stacks also give
# each transfer 1 s (default 120 s), so dropped or late (2 s) chunks fail it soon.
FAST = TransferTimeouts(heartbeat_interval_s=0.2, lease_s=2.0, peer_silence_s=2.0)
DEADLINE = dataclasses.replace(FAST, lease_s=1.0, transfer_s=1.0)
SHORTENED, DEADLINE_S = "KV lease and silence 2 s", "KV transfer deadline 1 s"  # the table's timeouts column
PROMPTS = [[(7 * i + 13 * j) % 380 + 3 for j in range(10 + 5 * i)] for i in range(16)]  # 10 .. 85 tokens


@pytest.fixture(scope="module")
def model(tiny_model_dirs):
    model_dir = tiny_model_dirs["llama"]
    return model_dir, AutoTokenizer.from_pretrained(model_dir)


def _args(model_dir: str, **kwargs) -> EngineArgs:
    return EngineArgs(model=model_dir, num_kv_blocks=128, max_model_len=256, **kwargs, dtype="float32")


def _config(model_dir: str) -> RouterConfig:
    return RouterConfig(model_dir, MODEL, max_model_len=256, load_refresh_s=0.2)


def _greedy_text(model, ids, n: int) -> str:
    model_dir, tokenizer = model
    return tokenizer.decode(hf_greedy(model_dir, ids, n), skip_special_tokens=True)


def _client(stack) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{stack.server.url}/v1", api_key="unused", max_retries=0, timeout=120)


async def _stream(client, ids, n: int, progress: list[int], i: int) -> tuple[str, str | None]:
    text, finish = "", None
    chunks = await client.completions.create(model=MODEL, prompt=ids, max_tokens=n, temperature=0, stream=True,
                                             extra_body={"ignore_eos": True})  # fmt: skip
    async for chunk in chunks:
        if chunk.choices:
            text += chunk.choices[0].text
            finish = chunk.choices[0].finish_reason or finish
            progress[i] += 1
    return text, finish


async def _complete(client, ids, n: int) -> tuple[str, str | None]:
    out = await client.completions.create(model=MODEL, prompt=ids, max_tokens=n, temperature=0,
                                          extra_body={"ignore_eos": True})  # fmt: skip
    return out.choices[0].text, out.choices[0].finish_reason


def _tally(results, expected: list[str]) -> tuple[int, int]:
    """(completed, lost): completed means the whole greedy text; anything else (an error, a gap) is lost."""
    completed = sum(1 for r, e in zip(results, expected) if not isinstance(r, BaseException) and r == (e, "length"))
    return completed, len(expected) - completed


def test_kill_9_a_decode_worker_under_16_open_streams(ray_session, model):
    n = 48
    expected = [_greedy_text(model, ids, n) for ids in PROMPTS]
    prefill = [PrefillWorkerConfig("prefill-0", FAST)]
    decode = [DecodeWorkerConfig(f"decode-{i}", timeouts=FAST) for i in range(2)]
    with fault_stack(ray_session, _args(model[0]), _config(model[0]), prefill, decode) as stack:

        victim, held, results = asyncio.run(_hit_the_busier_decode_worker(stack, n, kill_9, ray_session))
        victim = victim.name
        survivors = [name for name in stack.actors if name != victim]
        leaked = leaked_blocks(ray_session, stack, survivors)
    completed, lost = _tally(results, expected)
    record(f"kill -9 decode worker (1 of 2; it held {held} streams)", len(PROMPTS), completed, lost, leaked,
           timeouts=SHORTENED)
    assert held > 0 and (completed, lost, leaked) == (len(PROMPTS), 0, 0), results


async def _hit_the_busier_decode_worker(stack, n: int, fault, ray) -> tuple:
    """Open a stream per prompt; once the router has 2 tokens of each, `fault(ray, actor)` the decode worker
    holding the most; return (its state, how many it held, every stream's result).

    The router's count, not the client's: the router takes tokens as the workers make them, and a client
    slowed by a loaded machine may see its second token after the workers finished."""
    for name in ("decode-0", "decode-1"):  # steps a loaded machine cannot outrun: no stream ends before the fault
        await asyncio.to_thread(_slow_steps, ray, stack.actors[name], 0.03)
    client, progress = _client(stack), [0] * len(PROMPTS)
    streams = [asyncio.create_task(_stream(client, ids, n, progress, i)) for i, ids in enumerate(PROMPTS)]
    dispatcher = stack.app.state.router.dispatcher

    def two_tokens_of_each() -> bool:
        generations = list(dispatcher.active.values())
        return len(generations) == len(PROMPTS) and all(len(g.outputs.delivered) >= 2 for g in generations)

    while not two_tokens_of_each() and not any(s.done() for s in streams):
        await asyncio.sleep(0.005)
    victim = max(stack.registry.live("decode"), key=lambda w: w.in_flight)
    held = victim.in_flight
    await asyncio.to_thread(fault, ray, stack.actors[victim.name])
    return victim, held, await asyncio.gather(*streams, return_exceptions=True)


def _slow_steps(ray, actor, seconds: float) -> None:
    """Each forward of the worker takes `seconds` longer (its output is unchanged)."""

    def slow(a):
        execute = a.hosted.worker.engine.runner.execute

        def slowed(*args, **kwargs):
            time.sleep(seconds)
            return execute(*args, **kwargs)

        a.hosted.worker.engine.runner.execute = slowed

    ray.get(actor.__ray_call__.remote(slow))


def _break_every_step(ray, actor) -> None:
    """From now on every forward of the worker fails, as on a device that went bad (a sticky error)."""

    def broken(*args):
        raise RuntimeError("device lost (injected by the test)")

    ray.get(actor.__ray_call__.remote(lambda a: setattr(a.hosted.worker.engine.runner, "execute", broken)))


def test_a_decode_worker_whose_steps_keep_failing_is_taken_out_and_its_streams_move(ray_session, model):
    n = 24
    expected = [_greedy_text(model, ids, n) for ids in PROMPTS]
    prefill = [PrefillWorkerConfig("prefill-0", FAST)]
    decode = [DecodeWorkerConfig(f"decode-{i}", timeouts=FAST) for i in range(2)]
    with fault_stack(ray_session, _args(model[0]), _config(model[0]), prefill, decode) as stack:

        async def main():
            victim, held, results = await _hit_the_busier_decode_worker(stack, n, _break_every_step, ray_session)
            # Whatever still reaches it fails its step too: after a few in a row its heartbeat says so.
            more, client = [], _client(stack)
            while victim.alive and len(more) < 40:  # batches of 4 at once, so both workers get some
                await asyncio.sleep(0.5)  # a load poll (0.2 s) clears a suspect worker: it gets requests again
                more += await asyncio.gather(*(_complete(client, ids, 4) for ids in PROMPTS[:4]))
            return victim, held, results, more

        victim, held, results, more = asyncio.run(main())
        survivors = [name for name in stack.actors if name != victim.name]
        leaked = leaked_blocks(ray_session, stack, survivors)
    completed, lost = _tally(results, expected)
    record(f"every step of a decode worker fails (1 of 2; it held {held} streams)", len(PROMPTS), completed, lost,
           leaked, timeouts=SHORTENED)  # fmt: skip
    assert held > 0 and (completed, lost, leaked) == (len(PROMPTS), 0, 0), results
    assert not victim.alive and all(r == (_greedy_text(model, PROMPTS[i % 4], 4), "length") for i, r in enumerate(more))


def test_kill_9_a_prefill_worker_under_load(ray_session, model):
    n = 12
    expected = [_greedy_text(model, ids, n) for ids in PROMPTS]
    prefill = [PrefillWorkerConfig(f"prefill-{i}", FAST) for i in range(2)]
    decode = [DecodeWorkerConfig("decode-0", timeouts=FAST)]
    # Small prefill steps: prompts queue on each prefill worker, chunk after chunk.
    prefill_args = _args(model[0], max_num_batched_tokens=32)
    with fault_stack(ray_session, prefill_args, _config(model[0]), prefill, decode) as stack:

        async def main():
            client = _client(stack)
            requests = [asyncio.create_task(_complete(client, ids, n)) for ids in PROMPTS]
            victim = stack.registry.workers["prefill-0"]
            while victim.in_flight < 2 and not any(r.done() for r in requests):
                await asyncio.sleep(0.002)
            held = victim.in_flight
            await asyncio.to_thread(kill_9, ray_session, stack.actors["prefill-0"])
            return held, await asyncio.gather(*requests, return_exceptions=True)

        held, results = asyncio.run(main())
        leaked = leaked_blocks(ray_session, stack, ["prefill-1", "decode-0"])
    completed, lost = _tally(results, expected)
    record(f"kill -9 prefill worker (1 of 2; {held} prompts on it)", len(PROMPTS), completed, lost, leaked,
           timeouts=SHORTENED)
    assert (completed, lost, leaked) == (len(PROMPTS), 0, 0), results


@pytest.mark.parametrize("fault", ["drop", "delay"])
@pytest.mark.parametrize("policy", ["recompute", "fail"])
def test_lost_or_late_kv_chunks_follow_the_policy(ray_session, model, fault, policy):
    n, prompts = 8, PROMPTS[:4]
    faults = TransportFaults(drop_chunks=True) if fault == "drop" else TransportFaults(delay_chunks_s=2.0)
    prefill = [PrefillWorkerConfig("prefill-0", DEADLINE, transport_faults=faults)]
    decode = [DecodeWorkerConfig("decode-0", timeouts=DEADLINE, kv_transfer_failure=policy)]
    with fault_stack(ray_session, _args(model[0]), _config(model[0]), prefill, decode) as stack:

        async def main():
            client = _client(stack)
            return await asyncio.gather(*(_complete(client, ids, n) for ids in prompts), return_exceptions=True)

        results = asyncio.run(main())
        leaked = leaked_blocks(ray_session, stack, ["prefill-0", "decode-0"])
    expected = [_greedy_text(model, ids, n) for ids in prompts]
    completed, lost = _tally(results, expected)
    what = {"drop": "KV chunks dropped", "delay": "KV chunks delayed past the deadline"}[fault]
    if policy == "recompute":
        record(f"{what}, kv_transfer_failure=recompute", len(prompts), completed, lost, leaked, timeouts=DEADLINE_S)
        assert (completed, lost, leaked) == (len(prompts), 0, 0), results
    else:  # each request is refused with a clear error, and nothing stays held
        assert all(isinstance(r, openai.InternalServerError) and "its KV transfer failed" in str(r) for r in results), results
        record(f"{what}, kv_transfer_failure=fail (each answered 500, a clear error)", len(prompts),
               completed, lost - len(prompts), leaked, timeouts=DEADLINE_S)  # fmt: skip
        assert leaked == 0
