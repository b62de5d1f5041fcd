"""The tensor-parallel process group of one engine, and the all-reduce its layers call.

With tp_size == 1 there is no group: `SINGLE` stands in and nothing here touches
torch.distributed. With tp_size > 1 the ranks join one default process group
(gloo on CPU, NCCL on CUDA); under NCCL a second, gloo group carries the small
msgpack step headers, which live in host memory.
"""

from __future__ import annotations

import logging
import socket
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from engine.parallel.config import ParallelConfig

logger = logging.getLogger("tandem.engine")


@dataclass(frozen=True)
class TPGroup:
    """This process's place among the tensor-parallel ranks of one engine."""

    size: int = 1
    rank: int = 0
    device_group: object = None  # all-reduces and step tensors; None when size == 1
    cpu_group: object = None  # msgpack step headers (host memory)

    def all_reduce(self, tensor: torch.Tensor) -> None:
        """Sum `tensor` over the ranks, in place."""
        dist.all_reduce(tensor, group=self.device_group)

    @property
    def is_driver(self) -> bool:
        """Rank 0 schedules, samples and broadcasts each step."""
        return self.rank == 0


SINGLE = TPGroup()


def init_tp_group(parallel: ParallelConfig, device: str) -> TPGroup:
    """Join the group (blocks until all tp_size ranks have joined, or timeout_s passes)."""
    if parallel.tp_size == 1:
        return SINGLE
    if dist.is_initialized():
        raise RuntimeError("torch.distributed is already initialised in this process: one TP engine per process")
    host, port = parallel.host_port()
    backend = parallel.resolve_backend(device)
    timeout = timedelta(seconds=parallel.timeout_s)
    if backend == "nccl" and torch.device(device).index is not None:
        torch.cuda.set_device(torch.device(device))  # NCCL needs each rank on its own GPU
    store = _rendezvous_store(host, port, parallel, timeout)
    dist.init_process_group(backend, store=store, world_size=parallel.tp_size, rank=parallel.rank, timeout=timeout)
    device_group = dist.group.WORLD
    cpu_group = device_group if backend == "gloo" else dist.new_group(backend="gloo", timeout=timeout)
    logger.info("tensor parallel rank %d of %d joined at %s (%s)", parallel.rank, parallel.tp_size, host, backend)
    return TPGroup(parallel.tp_size, parallel.rank, device_group, cpu_group)


def _rendezvous_store(host: str, port: int, parallel: ParallelConfig, timeout: timedelta) -> dist.TCPStore:
    """The ranks' meeting point: rank 0 listens on `host` alone (torch's own TCPStore would listen on every
    interface, unauthenticated), the others connect to it."""
    if parallel.rank != 0:
        return dist.TCPStore(host, port, parallel.tp_size, is_master=False, timeout=timeout)
    return listening_store(host, port, parallel.tp_size, timeout)


def listening_store(host: str, port: int, world_size: int | None, timeout: timedelta) -> dist.TCPStore:
    """A master TCPStore listening on `host` alone (port 0: a free one, `store.port`); torch's own would
    listen on every interface, unauthenticated."""
    listener = socket.create_server((host, port))
    port = listener.getsockname()[1]
    # The store owns the socket from here (detach: Python never closes it under the store).
    return dist.TCPStore(host, port, world_size, is_master=True, timeout=timeout, wait_for_workers=False,
                         master_listen_fd=listener.detach())  # fmt: skip


def destroy_tp_group(group: TPGroup) -> None:
    if group.size > 1 and dist.is_initialized():
        dist.destroy_process_group()
