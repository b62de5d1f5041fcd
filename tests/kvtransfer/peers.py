"""Both ends of a KV transfer as functions a spawned child process runs, and shared test helpers.

Children report over a multiprocessing queue (test plumbing, not the data plane)."""

from __future__ import annotations

import contextlib
import threading

import torch

from kvtransfer import KVReceiver, KVSender, KVSpec, PeerTarget, TransferTimeouts

SPEC = KVSpec("tiny-test", "float32", block_size=4, num_layers=3, num_kv_heads=2, head_dim=8)
NUM_BLOCKS = 16
# Runs of consecutive ids on both sides merge into one frame; the rest go one by one.
SRC_BLOCKS = (3, 4, 5, 9, 1, 12, 13)
DST_BLOCKS = (7, 8, 9, 2, 14, 0, 1)
FAST = TransferTimeouts(heartbeat_interval_s=0.05, lease_s=1.0, peer_silence_s=1.0, transfer_s=60.0, handshake_s=20.0)


def poll_until_event(endpoint, polls: int = 2000, timeout_ms: int = 50) -> list:
    """Poll a sender or receiver until it reports transfer events; fail after `polls` empty polls."""
    for _ in range(polls):
        events = endpoint.poll(timeout_ms)
        if events:
            return events
    raise AssertionError(f"no transfer event after {polls} polls")


@contextlib.contextmanager
def serving(*receivers):
    """Poll the receivers from a thread (a sender waits for their answers as it polls); yield their events."""
    events, stop = [], threading.Event()

    def loop():
        while not stop.is_set():
            for receiver in receivers:
                events.extend(receiver.poll(5))

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        yield events
    finally:
        stop.set()
        thread.join()


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


def random_caches(spec: KVSpec, num_blocks: int, seed: int, num_heads: int | None = None):
    """Random bit patterns (NaNs and all), so equality below is bit-identity."""
    gen = torch.Generator().manual_seed(seed)
    dtype = getattr(torch, spec.dtype)
    shape = (num_blocks, spec.block_size, num_heads or spec.num_kv_heads, spec.head_dim)
    nbytes = torch.Size(shape).numel() * dtype.itemsize

    def one():
        return torch.randint(0, 256, (nbytes,), dtype=torch.uint8, generator=gen).view(dtype).view(shape)

    return [(one(), one()) for _ in range(spec.num_layers)]


def zero_caches(spec: KVSpec, num_blocks: int, num_heads: int | None = None, device: str = "cpu"):
    shape = (num_blocks, spec.block_size, num_heads or spec.num_kv_heads, spec.head_dim)
    dtype = getattr(torch, spec.dtype)
    return [(torch.zeros(shape, dtype=dtype, device=device), torch.zeros(shape, dtype=dtype, device=device))
            for _ in range(spec.num_layers)]  # fmt: skip


def blocks_bytes(cache: torch.Tensor, block_ids) -> bytes:
    """The raw bytes of these blocks, in order (plain bytes cross the test's queue without shared memory)."""
    return cache[list(block_ids)].cpu().view(torch.uint8).numpy().tobytes()


def receiver_main(reply, address: str, dist_backend: str, stop_after_bytes: int = 0, device: str = "cpu") -> None:
    """Reserve DST_BLOCKS for request "r", report the address, then the event and the reserved blocks.

    With `stop_after_bytes`, report "progress" once that much is written and keep polling (until killed)."""
    if device.startswith("cuda"):
        torch.cuda.set_device(device)
    caches = zero_caches(SPEC, NUM_BLOCKS, device=device)
    receiver = KVReceiver(caches, SPEC, address, dist_backend=dist_backend, timeouts=FAST)
    receiver.recv("r", DST_BLOCKS)
    reply.put(receiver.address)
    reported = False
    while True:
        events = receiver.poll(50)
        if stop_after_bytes and not reported and receiver.stats.bytes_written >= stop_after_bytes:
            reply.put("progress")
            reported = True
        if events:
            reply.put((events, [(blocks_bytes(k, DST_BLOCKS), blocks_bytes(v, DST_BLOCKS)) for k, v in caches]))
            return


def sender_main(reply, address: str, dst_blocks, num_layers: int, data_plane: str = "zmq") -> None:
    """Send the first `num_layers` layers of request "r" into `dst_blocks`, report "sent", poll until killed."""
    caches = random_caches(SPEC, NUM_BLOCKS, seed=1)
    sender = KVSender(SPEC, "test-sender", data_plane=data_plane, timeouts=FAST)
    sender.send("r", SRC_BLOCKS, PeerTarget(address, tuple(dst_blocks)))
    for layer in range(num_layers):
        sender.send_layer("r", layer, *caches[layer])
    reply.put("sent")
    while True:
        sender.poll(50)
