"""The prefill worker as Ray actors, and how one is built in any process.

One actor class, `PrefillActor`, for every rank, started by `runtime.ray_group` (TP=1: one actor,
`start_worker_actor`; TP=n: `start_tp_actors`, n of them in one STRICT_PACK placement group), rank 0
the worker itself, ranks 1..n-1 the forward loop and a `PrefillFollower` for their KV
heads. `prefill_worker_maker` builds the worker (for an actor, or a test that hosts it
in-process).
"""

from __future__ import annotations

from engine.llm_engine import EngineArgs
from runtime.engine_bridge import kv_spec_for
from wire.requests import PrefillTask
from kvtransfer.sender import KVSender
from wire.push_pull import Pushers
from prefill_worker.follower import PrefillFollower
from prefill_worker.kv_sending import KVSending
from prefill_worker.worker import PrefillWorker, PrefillWorkerConfig
from runtime.actor import WorkerActor, serving_engine
from runtime.control_service import ControlService, payload_of, request_id_arg
from runtime.io_thread import IOThread


# The router's calls a prefill worker's control socket takes (load is answered by the socket itself).
PREFILL_CALLS = {"prefill": payload_of(PrefillTask), "abort": request_id_arg}


def prefill_worker_maker(engine_args: EngineArgs, config: PrefillWorkerConfig):
    """`(board, deliver) -> PrefillWorker`: the engine, then the I/O thread (control socket + KV sender)."""

    def make(board, deliver) -> PrefillWorker:
        engine = serving_engine(engine_args, config.name, skip_tokenizer_init=True)
        model, tp_size = engine.config.model, engine.config.parallel.tp_size

        def services(io: IOThread) -> list:
            sender = KVSender(kv_spec_for(engine.config), config.name, tp_size, 0, timeouts=config.timeouts,
                              faults=config.transport_faults)  # fmt: skip
            sending = KVSending(sender, engine.runner.kv_caches, model.num_kv_heads, deliver)
            return [ControlService(board, PREFILL_CALLS, deliver, io.post, config.bind_address), sending]

        io = IOThread(f"{config.name}-io", services)
        return PrefillWorker(engine, config, io, board, Pushers(), control_address=io.services[0].address)

    return make


class PrefillActor(WorkerActor):
    """Every rank of a prefill worker (`runtime.actor.WorkerActor`): rank 0 (or TP=1) the worker, the router
    calling its control socket; rank r > 0 a `PrefillFollower` for its KV heads."""

    def __init__(self, engine_args: EngineArgs, config: PrefillWorkerConfig = PrefillWorkerConfig(),
                 torch_threads: int | None = 1, rank: int | None = None):  # fmt: skip
        super().__init__(engine_args, config, torch_threads, rank)

    def make_worker(self, engine_args):
        return prefill_worker_maker(engine_args, self.config)

    def follower_role(self) -> PrefillFollower:
        return PrefillFollower(self.config)

