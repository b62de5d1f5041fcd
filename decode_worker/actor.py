"""The decode worker as Ray actors, and how one is built in any process.

One actor class, `DecodeActor`, for every rank, started by `runtime.ray_group` (TP=1: one actor,
`start_worker_actor`; TP=n: `start_tp_actors`, n of them in one STRICT_PACK placement group), rank 0
the worker itself, ranks 1..n-1 the forward loop and a `DecodeFollower` for their KV
heads. `decode_worker_maker` builds the worker (for an actor, or a test that hosts it
in-process).
"""

from __future__ import annotations

from decode_worker.follower import DecodeFollower
from decode_worker.kv_receiving import KVReceiving
from decode_worker.worker import DecodeWorker, DecodeWorkerConfig
from engine.llm_engine import EngineArgs
from runtime.engine_bridge import kv_spec_for
from wire.requests import FirstToken, GenerateRequest, PrefillFailed
from kvtransfer.receiver import KVReceiver
from wire.push_pull import PullSocket, Pushers
from runtime.actor import WorkerActor, serving_engine
from runtime.control_service import ControlService, payload_of, request_id_arg
from runtime.io_thread import IOThread


# The router's calls a decode worker's control socket takes (load is answered by the socket itself).
DECODE_CALLS = {"reserve": payload_of(GenerateRequest), "abort": request_id_arg}


def decode_worker_maker(engine_args: EngineArgs, config: DecodeWorkerConfig):
    """`(board, deliver) -> DecodeWorker`: the engine, then the I/O thread (control socket + KV receiver)."""

    def make(board, deliver) -> DecodeWorker:
        engine = serving_engine(engine_args, config.name)
        spec, tp_size = kv_spec_for(engine.config), engine.config.parallel.tp_size

        def services(io: IOThread) -> list:
            receiver = KVReceiver(engine.runner.kv_caches, spec, config.bind_address, tp_size, 0, timeouts=config.timeouts)
            receiving = KVReceiving(receiver, deliver)
            board.io_counters = receiving.counters
            return [ControlService(board, DECODE_CALLS, deliver, io.post, config.bind_address), receiving]

        io = IOThread(f"{config.name}-io", services)
        control, receiving = io.services
        inbox = PullSocket((FirstToken, PrefillFailed), config.bind_address)
        return DecodeWorker(engine, config, io, board, receiving.receiver.address, inbox, Pushers(),
                            control_address=control.address)  # fmt: skip

    return make


class DecodeActor(WorkerActor):
    """Every rank of a decode worker (`runtime.actor.WorkerActor`): rank 0 (or TP=1) the worker, the router
    calling its control socket; rank r > 0 a `DecodeFollower` for its KV heads."""

    def __init__(self, engine_args: EngineArgs, config: DecodeWorkerConfig = DecodeWorkerConfig(),
                 torch_threads: int | None = 1, rank: int | None = None):  # fmt: skip
        super().__init__(engine_args, config, torch_threads, rank)

    def make_worker(self, engine_args):
        return decode_worker_maker(engine_args, self.config)

    def follower_role(self) -> DecodeFollower:
        return DecodeFollower(self.config)

