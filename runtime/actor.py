"""The Ray actor body of every rank of a worker, both roles: nothing here waits on a step.

    __init__(engine_args, config, torch_threads, rank)
        rank None: a TP=1 worker, built at once; rank r: rank r of a TP group, built by `start`
    start(init_addr)              join the group: rank 0 hosts the worker, rank r > 0 a follower
                                  (its answer is its endpoint, for rank 0's `attach_followers`)
    control_address()             where the router calls it (the control socket, served by the I/O thread)
    sender_key()                  the public key its token deltas carry (the router admits only registered ones)
    load()                        the controller's heartbeat: answered from the load board
    is_idle(), pool_all_free()    from the board (is_idle answering at all also means "built")
    attach_followers(endpoints)   tensor parallel rank 0, at start-up
    shutdown()                    end what is left; True if every block was free (a follower: loop ended)

The actor must be threaded (`max_concurrency` > 1, `runtime.ray_group.ACTOR_OPTIONS`, with which
`start_worker_actor` and `start_tp_actors` start every worker actor): a
heartbeat is answered while `start` or `shutdown` runs. A role's class says
how to build its worker (`make_worker`, its maker made by `worker_maker`) and
what a follower rank runs (`follower_role`). Requests never come over Ray: the
router (and every test that plays it) calls the control socket.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Callable

from runtime.control_service import ControlService, Decoders
from runtime.cpu_pinning import pin_this_process
from runtime.follower import FollowerHost, FollowerRole
from runtime.hosting import HostedWorker
from runtime.io_thread import IOThread
from runtime.load_board import LoadBoard
from runtime.priority import run_at_normal_priority
from runtime.serving_gc import tune_gc_for_serving
from runtime.worker_config import on_this_node
from wire.codec import encode
from wire.socket_security import sender_public_key, use_cluster_key

logger = logging.getLogger("tandem.worker")

def worker_maker(engine_args, config, calls: Decoders, kv_service: Callable, worker: Callable,
                 skip_tokenizer_init: bool = False) -> Callable:  # fmt: skip
    """A role's `(board, deliver) -> LoopWorker`: its serving engine, then its I/O thread, whose services are
    the role's KV service (`kv_service(engine, board, deliver)`, built on that thread) and the control
    socket taking the router's `calls`; then `worker(engine, io, board, deliver)`, `io.services` being
    (control, KV)."""

    def make(board, deliver):
        from engine.llm_engine import LLMEngine

        engine = LLMEngine.from_args(engine_args, skip_tokenizer_init=skip_tokenizer_init, show_progress=False)
        # Warmed up unless tensor parallel (its followers are not running their forward loops yet: the
        # group's first steps warm it).
        if engine.config.parallel.tp_size == 1:
            logger.info("%s: warmed up in %.2fs", config.name, engine.warm_up())

        def services(io: IOThread) -> list:
            kv = kv_service(engine, board, deliver)
            return [ControlService(board, calls, deliver, io.post, config.bind_address,
                                   router_key=config.router_key), kv]

        return worker(engine, IOThread(f"{config.name}-io", services), board, deliver)

    return make


def _own_process() -> bool:
    """Whether this runs as a Ray actor, in a process of its own: process-wide settings are its to make, not
    those of a test or a caller that builds the actor in its own process."""
    import ray

    return ray.is_initialized() and ray.get_runtime_context().get_actor_id() is not None


class WorkerActor:
    make_worker: Callable  # staticmethod: (engine_args, config) -> `(board, deliver) -> LoopWorker`, bound on `host`
    follower_role: type[FollowerRole]  # built with the config: what a follower rank runs beside its forward loop

    def __init__(self, engine_args, config, torch_threads: int | None = 1, rank: int | None = None):
        use_cluster_key(config.cluster_key)  # before any socket of this process opens
        run_at_normal_priority(config.name)
        cores = config.core_sets[rank or 0] if config.core_sets else ()
        if cores:  # before torch starts its threads: they inherit the set
            print(f"tandem: {config.name} rank {rank or 0} on cores {','.join(map(str, pin_this_process(cores)))}",
                  flush=True)  # fmt: skip
        if torch_threads is not None:
            import torch

            torch.set_num_threads(torch_threads)  # several actors share the host's cores
        self.engine_args, self.config, self.rank = engine_args, on_this_node(config), rank
        self.name = f"{config.name}-rank{rank}" if rank else config.name
        self.board = LoadBoard(config.name)
        self.hosted: HostedWorker | None = None  # TP=1 or rank 0
        self.follower: FollowerHost | None = None  # rank > 0
        if rank is None:
            self._host(engine_args)

    def _host(self, engine_args) -> None:
        self.hosted = HostedWorker(self.name, self.make_worker(engine_args, self.config), self.board)
        if _own_process():
            tune_gc_for_serving()  # built and warmed up: from here this process only serves

    # ---- tensor parallel start-up --------------------------------------------------
    def free_init_addr(self) -> str:
        from runtime.ray_group import free_init_addr

        return free_init_addr()

    def start(self, init_addr: str, leader_key: str = "") -> bytes | None:
        """Join the group at `init_addr` (blocks until every rank has): rank 0 builds the worker, a
        follower its forward loop and I/O thread (its rank link admitting only `leader_key`, rank 0's
        `sender_key()`) and answers its endpoint for rank 0."""
        args = dataclasses.replace(self.engine_args, tensor_parallel_rank=self.rank or 0, dist_init_addr=init_addr)
        if not self.rank:
            self._host(args)
            return None
        role = self.follower_role(self.config, leader_key)
        self.follower = FollowerHost(args.create_engine_config(), role, self.name)
        if _own_process():
            tune_gc_for_serving()
        return role.endpoint()

    def attach_followers(self, endpoints: list[bytes]) -> None:
        """Rank 0: the follower ranks' I/O services (their `start` answers, rank order)."""
        self.hosted.loop.call("attach_followers", endpoints)

    # ---- lifecycle ------------------------------------------------------------------
    def control_address(self) -> str:
        return self.hosted.worker.control_address

    def sender_key(self) -> str:
        """The public key its token deltas carry ("" unauthenticated): the cluster registers it with the router."""
        return sender_public_key()

    def load(self, _=None) -> bytes:
        return encode(self.board.heartbeat())

    def is_idle(self) -> bool:
        return self.hosted is not None and self.hosted.board.snapshot.idle

    def pool_all_free(self) -> bool:
        return self.hosted.board.snapshot.pool_all_free

    def shutdown(self) -> bool:
        """Stop, ending what is left; True if nothing was held and every block was free (a follower:
        its forward loop ended, after rank 0's shutdown, and nothing was in flight)."""
        if self.follower is not None:
            return self.follower.shutdown()
        if self.hosted is None:
            return True
        all_free = self.hosted.is_clean()
        self.hosted.stop()
        return all_free
