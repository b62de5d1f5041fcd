"""The decode worker as a Ray actor: a thin shell over `DecodeWorker` on its own step loop."""

from __future__ import annotations

from engine.llm_engine import EngineArgs
from engine.step_loop import LoopedActor
from kvtransfer.codec import decode, encode
from kvtransfer.protocol import GenerateRequest
from decode_worker.worker import DecodeWorker, DecodeWorkerConfig


class DecodeActor(LoopedActor):
    def __init__(self, engine_args: EngineArgs, config: DecodeWorkerConfig = DecodeWorkerConfig(), torch_threads: int | None = 1):
        super().__init__(lambda: DecodeWorker(engine_args, config), config.name, torch_threads)

    def reserve(self, payload: bytes) -> bytes:
        request = decode(payload, GenerateRequest)
        return encode(self.loop.call(lambda w: w.reserve(request)))

    def load(self, _=None) -> bytes:
        return encode(self.loop.call(lambda w: w.load()))


def start_decode_actor(
    engine_args: EngineArgs, config: DecodeWorkerConfig = DecodeWorkerConfig(), torch_threads: int | None = 1, **options
):
    """A Ray actor handle (Ray must be initialised); `options` go to `.options()` (resources, name...)."""
    import ray

    options.setdefault("num_cpus", 0)
    return ray.remote(DecodeActor).options(**options).remote(engine_args, config, torch_threads)
