"""The Ray actor body of a worker's rank 0: a hosted worker plus lifecycle methods, nothing that waits on a step.

    __init__ / start(init_addr)   build the worker (engine on its loop thread, sockets on its I/O thread)
    control_address()             where the router calls it (the control socket, served by the I/O thread)
    load()                        the controller's heartbeat: answered from the load board
    is_idle(), pool_all_free()    from the board (is_idle answering at all also means "built")
    attach_followers(endpoints)   tensor parallel, at start-up
    shutdown()                    end what is left; True if every block was free before

The actor must be threaded (`max_concurrency` > 1, see `ACTOR_OPTIONS`): a
heartbeat is answered while `start` or `shutdown` runs. Role subclasses say
how to build the worker (`make_worker`). Requests never come over Ray: the
router (and every test that plays it) calls the control socket.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

from wire.codec import encode
from runtime.hosting import HostedWorker
from runtime.load_board import LoadBoard
from runtime.worker_config import on_this_node

# Options every worker actor needs: a thread for heartbeats beside a long start or shutdown.
ACTOR_OPTIONS = {"max_concurrency": 8}


class WorkerActor:
    def __init__(self, engine_args, config, torch_threads: int | None = 1, start: bool = True):
        if torch_threads is not None:
            import torch

            torch.set_num_threads(torch_threads)  # several actors share the host's cores
        self.engine_args, self.config, self.name = engine_args, on_this_node(config), config.name
        self.board = LoadBoard(config.name)
        self.hosted: HostedWorker | None = None
        if start:
            self._host(engine_args)

    def make_worker(self, engine_args) -> Callable:
        """`(board, deliver) -> LoopWorker` for this role, binding its sockets on `config.host`."""
        raise NotImplementedError

    def _host(self, engine_args) -> None:
        self.hosted = HostedWorker(self.name, self.make_worker(engine_args), self.board)

    # ---- tensor parallel start-up --------------------------------------------------
    def free_init_addr(self) -> str:
        from runtime.ray_group import free_init_addr

        return free_init_addr()

    def start(self, init_addr: str) -> None:
        """Build the worker as rank 0 of its tensor-parallel group, meeting the other ranks at `init_addr`."""
        self._host(dataclasses.replace(self.engine_args, tensor_parallel_rank=0, dist_init_addr=init_addr))

    def attach_followers(self, endpoints: list[bytes]) -> None:
        """Rank 0: the follower ranks' I/O services (their `start` answers, rank order)."""
        self.hosted.loop.call("attach_followers", endpoints)

    # ---- lifecycle ------------------------------------------------------------------
    def control_address(self) -> str:
        return self.hosted.worker.control_address

    def load(self, _=None) -> bytes:
        return encode(self.board.heartbeat())

    def is_idle(self) -> bool:
        return self.hosted is not None and self.hosted.is_idle()

    def pool_all_free(self) -> bool:
        return self.hosted.pool_all_free()

    def shutdown(self) -> bool:
        """Stop the worker, ending what is left; True if it held nothing and every block was free before."""
        if self.hosted is None:
            return True
        all_free = self.hosted.is_clean()
        self.hosted.stop()
        return all_free
