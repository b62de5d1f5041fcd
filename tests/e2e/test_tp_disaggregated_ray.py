"""Tensor-parallel workers on a local Ray: prefill TP=1 -> decode TP=2 and prefill TP=2 -> decode TP=1.

Each TP worker is n actors in one placement group; every rank sends or receives
its own KV heads (llama: 2 KV heads, one per rank, so the KV is re-sharded).
Greedy outputs equal transformers' greedy generate token for token, for
concurrent requests of mixed lengths with prefix caching on, twice (the second
wave hits both workers' prefix caches); afterwards every rank's pool is free
(rank 0's block pool, the followers' receivers and senders hold nothing) and
every actor shuts down cleanly.
"""

from __future__ import annotations

import contextlib

from decode_worker.actor import start_decode_actor, start_decode_tp_actors
from decode_worker.worker import DecodeWorkerConfig
from engine import EngineArgs
from kvtransfer.token_stream import TokenStream
from prefill_worker.actor import start_prefill_actor, start_prefill_tp_actors
from prefill_worker.worker import PrefillWorkerConfig
from tests.conftest import hf_greedy
from tests.e2e.harness import PROMPTS, ray_endpoint, run_requests, wait_for


class _Single:
    """A TP=1 actor with the TPActors face (rank0, followers, shutdown, kill)."""

    def __init__(self, handle):
        self.rank0, self.followers = handle, []

    def shutdown(self) -> list[bool]:
        import ray

        return [ray.get(self.rank0.shutdown.remote())]

    def kill(self) -> None:
        import ray

        ray.kill(self.rank0, no_restart=True)


def _start(args: EngineArgs, config, start_one, start_tp):
    return start_tp(args, config) if args.tensor_parallel_size > 1 else _Single(start_one(args, config))


@contextlib.contextmanager
def _cluster(ray, model_dir: str, prefill_tp: int, decode_tp: int):
    def args(tp: int) -> EngineArgs:
        return EngineArgs(model=model_dir, num_kv_blocks=48, max_model_len=256, tensor_parallel_size=tp)

    workers, stream = [], TokenStream()
    try:
        workers.append(_start(args(decode_tp), DecodeWorkerConfig("decode-tp"), start_decode_actor, start_decode_tp_actors))
        workers.append(_start(args(prefill_tp), PrefillWorkerConfig("prefill-tp"), start_prefill_actor,
                              start_prefill_tp_actors))  # fmt: skip
        decode, prefill = workers
        yield ray_endpoint(decode.rank0), ray_endpoint(prefill.rank0), stream
        for worker in workers:
            wait_for(lambda: ray.get(worker.rank0.is_idle.remote()), "workers to go idle")
        # Rank 0: pool all free; followers: forward loop ended, nothing held by their KV sender/receiver.
        assert [worker.shutdown() for worker in workers] == [[True] * decode_tp, [True] * prefill_tp]
    finally:
        for worker in workers:
            worker.kill()
        stream.close()


def _run_twice_and_check(ray, model_dir: str, prefill_tp: int, decode_tp: int) -> None:
    with _cluster(ray, model_dir, prefill_tp, decode_tp) as (decode, prefill, stream):
        results, reservations = run_requests(stream, PROMPTS, lambda i: (decode, prefill))
        again = {f"again-{rid}": prompt for rid, prompt in PROMPTS.items()}
        results2, reservations2 = run_requests(stream, again, lambda i: (decode, prefill))
        prefill_load = prefill.load()
    assert all(r.tp_size == decode_tp and len(r.rank_addresses()) == decode_tp for r in reservations.values())
    for rid, prompt in PROMPTS.items():
        expected = hf_greedy(model_dir, prompt, 8)
        assert results[rid].token_ids == expected, rid
        assert results2[f"again-{rid}"].token_ids == expected, rid
        assert results[rid].final.finish_reason == "length"
    assert reservations2["again-long"].num_cached_blocks == len(PROMPTS["long"]) // 16  # decode's prefix cache
    assert prefill_load.prefix_cache_hit_rate > 0


def test_prefill_tp1_to_decode_tp2(ray_session, tiny_model_dirs):
    _run_twice_and_check(ray_session, tiny_model_dirs["llama"], prefill_tp=1, decode_tp=2)


def test_prefill_tp2_to_decode_tp1(ray_session, tiny_model_dirs):
    _run_twice_and_check(ray_session, tiny_model_dirs["llama"], prefill_tp=2, decode_tp=1)
