"""The torch.distributed data plane: a two-rank process group per (sender, receiver) pair.

Set up on demand: the receiver hosts one TCPStore; each sender that asks for
this data plane in its `Hello` gets a pair id in the `Welcome`, and both sides
build a 2-rank group under that prefix (receiver rank 0, sender rank 1) with
point-to-point send/recv. Control messages (headers, heartbeats, aborts) still
go over ZMQ; only tensor frames go through the group.

Backends: gloo for CPU tensors (testable anywhere), NCCL for GPU tensors.
Memory cost of NCCL: each pair is its own communicator. Per NCCL's
documentation of NCCL_BUFFSIZE (4 MiB by default), a communicator keeps a
buffer of that size per channel for each peer it talks to, in each direction,
besides its own device-side state; with a few channels that is tens of MiB of
GPU memory per pair (not measured here: no GPU), times the number of
(prefill rank, decode rank) pairs a worker holds. NCCL_BUFFSIZE and
NCCL_MAX_NCHANNELS lower it; so does keeping pairs few (a prefill rank pairs
only with the decode ranks its re-sharding plan feeds). Gloo pairs cost host
memory only (a TCP connection per pair).
"""

from __future__ import annotations

import queue
import threading
from concurrent.futures import Future
from datetime import timedelta

import torch
import torch.distributed as dist

from engine.parallel.group import listening_store

RECEIVER_RANK, SENDER_RANK = 0, 1


def host_store(host: str, timeout_s: float) -> tuple[dist.TCPStore, str]:
    """The receiver's store on a free port of `host`; returns it and "host:port"."""
    store = listening_store(host, 0, None, timedelta(seconds=timeout_s))
    return store, f"{host}:{store.port}"


def join_store(address: str, timeout_s: float) -> dist.TCPStore:
    host, port = address.rsplit(":", 1)
    return dist.TCPStore(host, int(port), is_master=False, timeout=timedelta(seconds=timeout_s))


class DistPair:
    """One sender and one receiver in their own process group (blocks until both have joined)."""

    def __init__(self, store: dist.Store, pair_id: int, rank: int, backend: str, timeout_s: float):
        prefix = dist.PrefixStore(f"tandem-kv-pair-{pair_id}", store)
        timeout = timedelta(seconds=timeout_s)
        if backend == "gloo":
            self.group = dist.ProcessGroupGloo(prefix, rank, 2, timeout)
        elif backend == "nccl":
            options = dist.ProcessGroupNCCL.Options()
            options._timeout = timeout
            self.group = dist.ProcessGroupNCCL(prefix, rank, 2, options)
        else:
            raise ValueError(f"unknown torch.distributed backend {backend!r}; use gloo or nccl")
        self.rank = rank
        self.peer = SENDER_RANK if rank == RECEIVER_RANK else RECEIVER_RANK
        self._waiter = _Waiter()

    def send(self, tensors: list[torch.Tensor], tag: int) -> Future:
        """Post one send per tensor (in order, same tag); the future is done once all have left."""
        works = [self.group.send([t.reshape(-1).view(torch.uint8)], self.peer, tag) for t in tensors]
        return self._waiter.submit(works, tensors)

    def post_recv(self, sizes: list[int], tag: int, device: torch.device) -> tuple[list[torch.Tensor], Future]:
        """Post receives for the next tensors with this tag, of these byte sizes, into fresh staging memory.

        The future is done once all have arrived (its result() raises if one failed).
        Staging, never the cache: a transfer that fails halfway leaves no partial write."""
        staging = [torch.empty(n, dtype=torch.uint8, device=device) for n in sizes]
        works = [self.group.recv([t], self.peer, tag) for t in staging]
        return staging, self._waiter.submit(works, staging)

    def close(self) -> None:
        self._waiter.stop()


class _Waiter:
    """A daemon thread that waits on works in posting order and completes their futures.

    gloo marks a send or receive complete only inside `wait()`, so polling
    `is_completed()` from the engine loop would never see it finish."""

    def __init__(self):
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        threading.Thread(target=self._run, name="tandem-kv-pair-waiter", daemon=True).start()

    def submit(self, works: list, keep_alive: list[torch.Tensor]) -> Future:
        future: Future = Future()
        self._queue.put((works, keep_alive, future))
        return future

    def stop(self) -> None:
        self._queue.put(None)

    def _run(self) -> None:
        while (item := self._queue.get()) is not None:
            works, _keep_alive, future = item
            try:
                for work in works:
                    work.wait()
                future.set_result(None)
            except Exception as e:  # noqa: BLE001 - handed to whoever polls the future
                future.set_exception(e)
