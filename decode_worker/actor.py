"""The decode worker as Ray actors (`DecodeActor`, one class for every rank: `runtime.actor`), and how one is
built in any process (`decode_worker_maker`: for an actor, or a test that hosts it in-process)."""

from __future__ import annotations

from decode_worker.follower import DecodeFollower
from decode_worker.kv_receiving import KVReceiving
from decode_worker.worker import DecodeWorker, DecodeWorkerConfig
from engine.llm_engine import EngineArgs
from runtime.engine_bridge import kv_spec_for
from wire.requests import FirstToken, GenerateRequest, PrefillFailed
from kvtransfer.receiver import KVReceiver
from wire.push_pull import PullSocket, Pushers
from runtime.actor import WorkerActor, worker_maker
from runtime.control_service import payload_of, request_id_arg


# The router's calls a decode worker's control socket takes (load is answered by the socket itself).
DECODE_CALLS = {"reserve": payload_of(GenerateRequest), "abort": request_id_arg}


def decode_worker_maker(engine_args: EngineArgs, config: DecodeWorkerConfig):
    """`(board, deliver) -> DecodeWorker`: the engine, then the I/O thread (control socket + KV receiver)."""

    def receiving(engine, board, deliver) -> KVReceiving:
        receiver = KVReceiver(engine.runner.kv_caches, kv_spec_for(engine.config), config.bind_address,
                              engine.config.parallel.tp_size, 0, timeouts=config.timeouts)  # fmt: skip
        service = KVReceiving(receiver, deliver)
        board.io_counters = service.counters
        return service

    def worker(engine, io, board, deliver) -> DecodeWorker:
        control, service = io.services
        inbox = PullSocket((FirstToken, PrefillFailed), config.bind_address)
        return DecodeWorker(engine, config, io, board, service.receiver.address, inbox, Pushers(),
                            control_address=control.address, deliver=deliver)  # fmt: skip

    return worker_maker(engine_args, config, DECODE_CALLS, receiving, worker)


class DecodeActor(WorkerActor):
    """Every rank of a decode worker (`runtime.actor.WorkerActor`): rank 0 (or TP=1) the worker, the router
    calling its control socket; rank r > 0 a `DecodeFollower` for its KV heads."""

    make_worker, follower_role = staticmethod(decode_worker_maker), DecodeFollower
