"""How fast a request's KV moves from a prefill worker to a decode worker on this machine: the real
`kvtransfer` sender and receiver (ZMQ over loopback), the receiver in a process of its own, the model's
own KV layout, timed from the first send until the sender sees the receiver's done.

Two sizes, a few repetitions each (median), give the two terms of `costmodel.TransferCost`: the slope
is bytes per second, what is left at zero bytes the latency.
"""

from __future__ import annotations

import multiprocessing
import statistics
import time

import torch

from costmodel import TransferCost
from kvtransfer import KVReceiver, KVSender, KVSpec, PeerTarget

_CTX = multiprocessing.get_context("spawn")
_POLL_MS = 50


def _caches(spec: KVSpec, num_blocks: int, fill: bool) -> list[tuple[torch.Tensor, torch.Tensor]]:
    shape = (num_blocks, spec.block_size, spec.num_kv_heads, spec.head_dim)
    make = torch.randn if fill else torch.zeros
    dtype = getattr(torch, spec.dtype)
    return [(make(shape).to(dtype), make(shape).to(dtype)) for _ in range(spec.num_layers)]


def _receiver(conn, spec: KVSpec, num_blocks: int) -> None:
    """Commands over the pipe: ("recv", request id, block ids) -> "ok"; ("stop",)."""
    torch.set_num_threads(1)
    receiver = KVReceiver(_caches(spec, num_blocks, fill=False), spec)
    conn.send(receiver.address)
    try:
        while True:
            receiver.poll(_POLL_MS)
            if conn.poll(0):
                command = conn.recv()
                if command[0] == "stop":
                    return
                receiver.recv(command[1], command[2])
                conn.send("ok")
    finally:
        receiver.close()


def measure_transfer(spec: KVSpec, sizes_tokens: tuple[int, int] = (256, 2048), reps: int = 3) -> TransferCost:
    num_blocks = -(-max(sizes_tokens) // spec.block_size)
    parent, child = _CTX.Pipe()
    process = _CTX.Process(target=_receiver, args=(child, spec, num_blocks), daemon=True)
    process.start()
    sender = KVSender(spec, "profile")
    try:
        address = parent.recv()
        caches = _caches(spec, num_blocks, fill=True)
        token_bytes = 2 * spec.num_layers * spec.num_kv_heads * spec.head_dim * caches[0][0].element_size()
        seconds = []
        for tokens in sizes_tokens:
            blocks = list(range(-(-tokens // spec.block_size)))
            runs = [_time_one(sender, parent, address, caches, blocks, f"{tokens}-{rep}") for rep in range(reps + 1)]
            seconds.append(statistics.median(runs[1:]))  # the first pays the handshake
        (small, large), (t_small, t_large) = (n * token_bytes for n in sizes_tokens), seconds
        bytes_per_s = (large - small) / max(t_large - t_small, 1e-9)
        return TransferCost(max(0.0, t_small - small / bytes_per_s), bytes_per_s)
    finally:
        sender.close()
        parent.send(("stop",))
        process.join(10)


def _time_one(sender: KVSender, conn, address: str, caches, blocks: list[int], request_id: str) -> float:
    conn.send(("recv", request_id, blocks))
    conn.recv()
    start = time.perf_counter()
    sender.send(request_id, blocks, PeerTarget(address, tuple(blocks)))
    for layer, (k, v) in enumerate(caches):
        sender.send_layer(request_id, layer, k, v)
    while not (events := sender.poll(_POLL_MS)):
        pass
    if events[0].kind != "done":
        raise RuntimeError(f"the probe's KV transfer ended {events[0].kind}: {events[0].reason}")
    return time.perf_counter() - start
