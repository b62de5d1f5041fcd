"""The decode worker as Ray actors: a thin shell over `DecodeWorker` on its own step loop.

TP=1: one `DecodeActor` (`start_decode_actor`). TP=n (`start_decode_tp_actors`):
rank 0 is a `DecodeActor` whose engine schedules and broadcasts each step;
ranks 1..n-1 are `DecodeFollowerActor`s running the forward loop and a
`ShardReceiver`, all in one STRICT_PACK placement group.
"""

from __future__ import annotations

from decode_worker.shard_receiver import ShardReceiver
from decode_worker.worker import DecodeWorker, DecodeWorkerConfig
from engine.llm_engine import EngineArgs
from engine.parallel.follower_host import FollowerActor
from engine.parallel.ray_group import TPActors, start_tp_actors
from engine.step_loop import LoopedActor
from kvtransfer.codec import decode, encode
from kvtransfer.control_server import COMMON_CALLS, ControlServed
from kvtransfer.protocol import GenerateRequest


def _reserve(payload: bytes):
    request = decode(payload, GenerateRequest)
    return lambda worker: encode(worker.reserve(request))


DECODE_CALLS = {"reserve": _reserve, **COMMON_CALLS}


class DecodeActor(ControlServed, LoopedActor):
    """Rank 0 (the worker's face): Ray methods for the lifecycle; the router calls its control socket."""

    control_calls = DECODE_CALLS

    def __init__(self, engine_args: EngineArgs, config: DecodeWorkerConfig = DecodeWorkerConfig(),
                 torch_threads: int | None = 1, start: bool = True):  # fmt: skip
        super().__init__(lambda args: DecodeWorker(args, config), engine_args, config.name, torch_threads, start)

    def reserve(self, payload: bytes) -> bytes:
        return self.loop.call(_reserve(payload))

    def load(self, _=None) -> bytes:
        return encode(self.loop.call(lambda w: w.load()))


class DecodeFollowerActor(FollowerActor):
    """Decode rank > 0: the forward loop and a `ShardReceiver` for this rank's KV heads."""

    def make_io(self, follower) -> ShardReceiver:
        c = self.config
        return ShardReceiver(follower, c.kv_address, c.control_address, c.timeouts)


def start_decode_actor(
    engine_args: EngineArgs, config: DecodeWorkerConfig = DecodeWorkerConfig(), torch_threads: int | None = 1, **options
):
    """A Ray actor handle (Ray must be initialised); `options` go to `.options()` (resources, name...)."""
    import ray

    options.setdefault("num_cpus", 0)
    return ray.remote(DecodeActor).options(**options).remote(engine_args, config, torch_threads)


def start_decode_tp_actors(
    engine_args: EngineArgs, config: DecodeWorkerConfig = DecodeWorkerConfig(), torch_threads: int | None = 1, **options
) -> TPActors:
    """engine_args.tensor_parallel_size actors on one node; `.rank0` is the worker's handle (`options` go to it)."""
    return start_tp_actors(DecodeActor, DecodeFollowerActor, engine_args, config, torch_threads, **options)
