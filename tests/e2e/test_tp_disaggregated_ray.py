"""Tensor-parallel workers on a local Ray: prefill TP=1 -> decode TP=2 and prefill TP=2 -> decode TP=1.

Each TP worker is n actors in one placement group; every rank sends or receives
its own KV heads (llama: 2 KV heads, one per rank, so the KV is re-sharded).
Greedy outputs equal transformers' greedy generate token for token, for
concurrent requests of mixed lengths with prefix caching on, twice (the second
wave hits both workers' prefix caches); afterwards every rank's pool is free
(rank 0's block pool, the followers' receivers and senders hold nothing) and
every actor shuts down cleanly. A transfer that cannot start, or KV that
never comes, ends the request on every rank with a clear error, no block kept.
"""

from __future__ import annotations

import contextlib
import dataclasses

from decode_worker.actor import DecodeActor
from decode_worker.worker import DecodeWorkerConfig
from engine import EngineArgs
from kvtransfer.connector import TransferTimeouts
from wire.push_pull import TokenStream
from prefill_worker.actor import PrefillActor
from runtime.ray_group import start_tp_actors, start_worker_actor
from prefill_worker.worker import PrefillWorkerConfig
from tests.conftest import hf_greedy
from tests.e2e.harness import PROMPTS, Driver, request, run_requests, start_request, wait_for


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


def _start(actor_cls, args: EngineArgs, config):
    if args.tensor_parallel_size > 1:
        return start_tp_actors(actor_cls, args, config)
    return _Single(start_worker_actor(actor_cls, args, config))


@contextlib.contextmanager
def _cluster(ray, model_dir: str, prefill_tp: int, decode_tp: int, timeouts: TransferTimeouts = TransferTimeouts(),
             kv_transfer_failure: str = "recompute"):  # fmt: skip
    def args(tp: int) -> EngineArgs:
        return EngineArgs(model=model_dir, num_kv_blocks=48, max_model_len=256, tensor_parallel_size=tp, dtype="float32")

    workers, stream, driver = [], TokenStream(), Driver()
    try:
        decode_config = DecodeWorkerConfig("decode-tp", timeouts=timeouts, kv_transfer_failure=kv_transfer_failure)
        workers.append(_start(DecodeActor, args(decode_tp), decode_config))
        workers.append(_start(PrefillActor, args(prefill_tp), PrefillWorkerConfig("prefill-tp", timeouts=timeouts)))
        decode, prefill = workers
        assert ray.get([worker.rank0.is_idle.remote() for worker in workers]) == [True, True]  # built and serving
        yield driver.endpoint(decode.rank0), driver.endpoint(prefill.rank0), stream
        for worker in workers:
            wait_for(lambda: ray.get(worker.rank0.is_idle.remote()), "workers to go idle")
        # Rank 0: pool all free; followers: forward loop ended, nothing held by their KV sender/receiver.
        assert [worker.shutdown() for worker in workers] == [[True] * decode_tp, [True] * prefill_tp]
    finally:
        driver.close()
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


class _RankOneUnreachable:
    """The prefill endpoint, handed a reservation whose decode rank 1 address leads nowhere."""

    def __init__(self, prefill):
        self.driver, self.calls, self._calls = prefill.driver, self, prefill.calls

    async def prefill(self, task) -> None:
        res = task.reservation
        bad = dataclasses.replace(res, kv_addresses=(res.kv_addresses[0], "tcp://127.0.0.1:9"))
        await self._calls.prefill(dataclasses.replace(task, reservation=bad))

    async def abort(self, request_id: str) -> None:
        await self._calls.abort(request_id)


def test_failed_shards_end_the_request_on_every_rank(ray_session, tiny_model_dirs):
    model_dir = tiny_model_dirs["llama"]
    fast = TransferTimeouts(handshake_s=1.0, transfer_s=3.0)
    with _cluster(ray_session, model_dir, 1, 2, fast, kv_transfer_failure="fail") as (decode, prefill, stream):
        # Rank 1's piece cannot start: the prefill fails the request, decode drops it on both ranks.
        start_request(request("unreachable", PROMPTS["long"], stream), decode, _RankOneUnreachable(prefill))
        # Reserved, but no prefill worker ever sends: every rank's receiver times out.
        decode.reserve(request("never-sent", PROMPTS["mid"], stream))
        wait_for(lambda: stream.finished("unreachable") and stream.finished("never-sent"), "failures", stream=stream)
        results, _ = run_requests(stream, {"after": PROMPTS["shared-b"]}, lambda i: (decode, prefill))
    unreachable, never_sent = (stream.requests[r].final for r in ("unreachable", "never-sent"))
    assert unreachable.finish_reason == "abort" and "did not answer the handshake" in unreachable.error
    assert never_sent.finish_reason == "abort" and "timed out after 3.0s" in never_sent.error
    assert results["after"].token_ids == hf_greedy(model_dir, PROMPTS["shared-b"], 8)  # still serving
