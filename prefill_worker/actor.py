"""The prefill worker as a Ray actor: a thin shell over `PrefillWorker` on its own step loop."""

from __future__ import annotations

from engine.llm_engine import EngineArgs
from engine.step_loop import LoopedActor
from kvtransfer.codec import decode, encode
from kvtransfer.protocol import PrefillTask
from prefill_worker.worker import PrefillWorker, PrefillWorkerConfig


class PrefillActor(LoopedActor):
    def __init__(self, engine_args: EngineArgs, config: PrefillWorkerConfig = PrefillWorkerConfig(), torch_threads: int | None = 1):
        super().__init__(lambda: PrefillWorker(engine_args, config), config.name, torch_threads)

    def prefill(self, payload: bytes) -> None:
        task = decode(payload, PrefillTask)
        self.loop.call(lambda w: w.prefill(task))

    def load(self, _=None) -> bytes:
        return encode(self.loop.call(lambda w: w.load()))


def start_prefill_actor(
    engine_args: EngineArgs, config: PrefillWorkerConfig = PrefillWorkerConfig(), torch_threads: int | None = 1, **options
):
    """A Ray actor handle (Ray must be initialised); `options` go to `.options()` (resources, name...)."""
    import ray

    options.setdefault("num_cpus", 0)
    return ray.remote(PrefillActor).options(**options).remote(engine_args, config, torch_threads)
