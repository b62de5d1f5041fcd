"""The prefill worker as Ray actors: a thin shell over `PrefillWorker` on its own step loop.

TP=1: one `PrefillActor` (`start_prefill_actor`). TP=n (`start_prefill_tp_actors`):
rank 0 is a `PrefillActor` whose engine schedules and broadcasts each step;
ranks 1..n-1 are `PrefillFollowerActor`s running the forward loop and a
`ShardSender`, all in one STRICT_PACK placement group.
"""

from __future__ import annotations

from engine.llm_engine import EngineArgs
from engine.parallel.follower_host import FollowerActor
from engine.parallel.ray_group import TPActors, start_tp_actors
from engine.step_loop import LoopedActor
from kvtransfer.codec import decode, encode
from kvtransfer.control_server import COMMON_CALLS, ControlServed
from kvtransfer.protocol import PrefillTask
from prefill_worker.shard_sender import ShardSender
from prefill_worker.worker import PrefillWorker, PrefillWorkerConfig


def _prefill(payload: bytes):
    task = decode(payload, PrefillTask)
    return lambda worker: worker.prefill(task)


PREFILL_CALLS = {"prefill": _prefill, **COMMON_CALLS}


class PrefillActor(ControlServed, LoopedActor):
    """Rank 0 (the worker's face): Ray methods for the lifecycle; the router calls its control socket."""

    control_calls = PREFILL_CALLS

    def __init__(self, engine_args: EngineArgs, config: PrefillWorkerConfig = PrefillWorkerConfig(),
                 torch_threads: int | None = 1, start: bool = True):  # fmt: skip
        super().__init__(lambda args: PrefillWorker(args, config), engine_args, config.name, torch_threads, start)

    def prefill(self, payload: bytes) -> None:
        self.loop.call(_prefill(payload))

    def load(self, _=None) -> bytes:
        return encode(self.loop.call(lambda w: w.load()))


class PrefillFollowerActor(FollowerActor):
    """Prefill rank > 0: the forward loop and a `ShardSender` for this rank's KV heads."""

    def make_io(self, follower) -> ShardSender:
        return ShardSender(follower, self.name, self.config.control_address, self.config.timeouts)


def start_prefill_actor(
    engine_args: EngineArgs, config: PrefillWorkerConfig = PrefillWorkerConfig(), torch_threads: int | None = 1, **options
):
    """A Ray actor handle (Ray must be initialised); `options` go to `.options()` (resources, name...)."""
    import ray

    options.setdefault("num_cpus", 0)
    return ray.remote(PrefillActor).options(**options).remote(engine_args, config, torch_threads)


def start_prefill_tp_actors(
    engine_args: EngineArgs, config: PrefillWorkerConfig = PrefillWorkerConfig(), torch_threads: int | None = 1, **options
) -> TPActors:
    """engine_args.tensor_parallel_size actors on one node; `.rank0` is the worker's handle (`options` go to it)."""
    return start_tp_actors(PrefillActor, PrefillFollowerActor, engine_args, config, torch_threads, **options)
