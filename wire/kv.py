"""The KV data plane's messages: the handshake, the chunk headers, heartbeats and endings.

A connection starts with the sender's `Hello`; the receiver answers `Welcome`
or `Refused` (`kvtransfer.handshake` decides). After that, senders push `KVChunk`s
(a msgpack header followed by raw tensor frames), receivers answer
`TransferDone` or `Abort`, and both sides send `Heartbeat`s listing the
requests they still hold.

    prefill (sender)                     decode (receiver)
      Hello ─────────────────────────────►  check version, compat hash, TP
      ◄──────────────────────── Welcome | Refused
      KVChunk + frames (per layer) ──────►  validate, write into reserved blocks
      ◄─────────────────────── Heartbeat(request ids)   renews sender's leases
      Heartbeat(request ids) ────────────►  proves the sender alive
      ◄──────────────────────── TransferDone | Abort
      Abort ─────────────────────────────►
"""

from __future__ import annotations

import hashlib
from dataclasses import field

from wire.codec import encode, message

PROTOCOL_VERSION = 1

# [num_blocks, block_size, num_kv_heads, head_dim] per layer, K and V separate (engine/kv_cache.py).
PAGED_LAYOUT = "blocks,block_size,kv_heads,head_dim"


@message
class KVSpec:
    """What both ends must agree on for block bytes to mean the same thing."""

    model: str
    dtype: str  # torch dtype name, e.g. "float32"
    block_size: int
    num_layers: int
    num_kv_heads: int  # the model's total, before tensor-parallel sharding
    head_dim: int
    layout: str = PAGED_LAYOUT


def compat_hash(spec: KVSpec) -> str:
    """Hex digest over every field of the spec (model, dtype, block size, layout, shape)."""
    return hashlib.blake2b(encode(spec), digest_size=16).hexdigest()


@message
class Hello:
    version: int
    compat_hash: str
    spec: KVSpec
    tp_size: int
    tp_rank: int
    sender_name: str
    data_plane: str  # "zmq" (tensor frames inline) or "gloo"/"nccl" (torch.distributed pair)


@message
class Welcome:
    version: int
    tp_size: int
    tp_rank: int
    dist_store: str  # "host:port" of the receiver's TCPStore for a torch.distributed pair, or ""
    dist_pair_id: int  # which pair group in that store this sender joins


@message
class Refused:
    reason: str


@message
class KVChunk:
    """One layer's K and V for some block runs of one request.

    Followed by 2 frames per run, K then V, each [run_len, block_size, num_heads, head_dim]
    in the spec's dtype, contiguous; or, if `gathered`, by just 2 frames (K, V) holding
    every run back to back. Heads land at [head_start, head_start + num_heads) of the
    receiver's local (tensor-parallel shard) heads. `dist_tag` > 0 means the frames
    come over the torch.distributed pair with that tag instead of inline.
    """

    request_id: str
    layer: int
    dst_runs: tuple[tuple[int, int], ...]  # (first destination block id, number of blocks)
    head_start: int
    num_heads: int
    gathered: bool = False
    dist_tag: int = 0
    transfer_token: str = field(default="", repr=False)  # the reservation's (DecodeReservation.transfer_token)

    def frame_blocks(self) -> list[int]:
        """Blocks in each frame that follows, in order (K, V, K, V, ...)."""
        lengths = [sum(n for _, n in self.dst_runs)] if self.gathered else [n for _, n in self.dst_runs]
        return [n for n in lengths for _ in "kv"]


@message
class TransferDone:
    """Receiver to sender: every block of the request is written; the sender may free its blocks."""

    request_id: str


@message
class Abort:
    """Either way: the request's transfer is over and failed; each side frees what it holds."""

    request_id: str
    reason: str
    transfer_token: str = field(default="", repr=False)  # a sender's Abort: the reservation's, as its chunks carry


@message
class Heartbeat:
    """Either way, every heartbeat interval: the requests the sending side still holds."""

    request_ids: tuple[str, ...]
