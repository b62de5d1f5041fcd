"""The prefill worker as Ray actors (`PrefillActor`, one class for every rank: `runtime.actor`), and how one is
built in any process (`prefill_worker_maker`: for an actor, or a test that hosts it in-process)."""

from __future__ import annotations

from engine.llm_engine import EngineArgs
from runtime.engine_bridge import kv_spec_for
from wire.requests import PrefillTask
from kvtransfer.sender import KVSender
from wire.push_pull import Pushers
from prefill_worker.follower import PrefillFollower
from prefill_worker.kv_sending import KVSending
from prefill_worker.worker import PrefillWorker, PrefillWorkerConfig
from runtime.actor import WorkerActor, worker_maker
from runtime.control_service import payload_of, request_id_arg


# The router's calls a prefill worker's control socket takes (load is answered by the socket itself).
PREFILL_CALLS = {"prefill": payload_of(PrefillTask), "abort": request_id_arg}


def prefill_worker_maker(engine_args: EngineArgs, config: PrefillWorkerConfig):
    """`(board, deliver) -> PrefillWorker`: the engine, then the I/O thread (control socket + KV sender)."""

    def sending(engine, board, deliver) -> KVSending:
        sender = KVSender(kv_spec_for(engine.config), config.name, engine.config.parallel.tp_size, 0,
                          timeouts=config.timeouts, faults=config.transport_faults)  # fmt: skip
        return KVSending(sender, engine.runner.kv_caches, engine.config.model.num_kv_heads, deliver)

    def worker(engine, io, board, deliver) -> PrefillWorker:
        return PrefillWorker(engine, config, io, board, Pushers(), control_address=io.services[0].address,
                             deliver=deliver)  # fmt: skip

    return worker_maker(engine_args, config, PREFILL_CALLS, sending, worker, skip_tokenizer_init=True)


class PrefillActor(WorkerActor):
    """Every rank of a prefill worker (`runtime.actor.WorkerActor`): rank 0 (or TP=1) the worker, the router
    calling its control socket; rank r > 0 a `PrefillFollower` for its KV heads."""

    make_worker, follower_role = staticmethod(prefill_worker_maker), PrefillFollower
