"""The disaggregated pipeline on a local Ray: prefill and decode actors, KV over ZMQ, tokens over ZMQ.

Greedy outputs equal transformers' greedy generate token for token; after each
test every actor's block pool is all free and every actor shuts down cleanly.
"""

from __future__ import annotations

import contextlib
import itertools

from decode_worker.actor import DecodeActor
from decode_worker.worker import DecodeWorkerConfig
from engine import EngineArgs
from wire.push_pull import TokenStream
from prefill_worker.actor import PrefillActor
from runtime.ray_group import start_worker_actor
from prefill_worker.worker import PrefillWorkerConfig
from tests.conftest import hf_greedy
from tests.e2e.harness import PROMPTS, Driver, run_requests, wait_for


@contextlib.contextmanager
def _cluster(ray, model_dir: str, num_prefill: int, local_prefill_threshold: int = 0):
    args = EngineArgs(model=model_dir, num_kv_blocks=48, max_model_len=256, dtype="float32")
    prefills = [start_worker_actor(PrefillActor, args, PrefillWorkerConfig(f"prefill-{i}")) for i in range(num_prefill)]
    decode = start_worker_actor(DecodeActor, args, DecodeWorkerConfig("decode-0", local_prefill_threshold=local_prefill_threshold))
    actors = [decode, *prefills]
    stream, driver = TokenStream(), Driver()
    try:
        yield driver.endpoint(decode), [driver.endpoint(p) for p in prefills], stream
        for actor in actors:
            wait_for(lambda: ray.get(actor.is_idle.remote()), "workers to go idle")
        # shutdown() answers whether the pool was all free, then stops the step loop and closes sockets.
        assert ray.get([actor.shutdown.remote() for actor in actors]) == [True] * len(actors)
    finally:
        driver.close()
        for actor in actors:
            ray.kill(actor, no_restart=True)
        stream.close()


def _check_tokens(results, model_dir: str) -> None:
    for rid, prompt in PROMPTS.items():
        assert results[rid].token_ids == hf_greedy(model_dir, prompt, 8), rid
        assert results[rid].final.finish_reason == "length"


def test_one_prefill_one_decode(ray_session, tiny_model_dirs):
    model_dir = tiny_model_dirs["llama"]
    with _cluster(ray_session, model_dir, 1) as (decode, (prefill,), stream):
        results, reservations = run_requests(stream, PROMPTS, lambda i: (decode, prefill))
    assert not any(r.prefill_locally for r in reservations.values())
    _check_tokens(results, model_dir)


def test_two_prefill_one_decode(ray_session, tiny_model_dirs):
    model_dir = tiny_model_dirs["qwen3"]
    with _cluster(ray_session, model_dir, 2) as (decode, prefills, stream):
        turn = itertools.cycle(prefills)
        results, _ = run_requests(stream, PROMPTS, lambda i: (decode, next(turn)))
        loads = [p.load() for p in prefills]
    assert all(load.total_blocks == 48 for load in loads)
    _check_tokens(results, model_dir)


def test_colocated_decode_alone(ray_session, tiny_model_dirs):
    model_dir = tiny_model_dirs["llama"]
    with _cluster(ray_session, model_dir, 0, local_prefill_threshold=10**6) as (decode, _, stream):
        results, reservations = run_requests(stream, PROMPTS, lambda i: (decode, None))
    assert all(r.prefill_locally for r in reservations.values())
    _check_tokens(results, model_dir)
