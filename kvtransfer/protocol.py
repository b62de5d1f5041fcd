"""Every message that crosses the KV data plane, and the handshake's compatibility check.

A connection starts with the sender's `Hello`; the receiver answers `Welcome`
or `Refused`. After that, senders push `KVChunk`s (a msgpack header followed by
raw tensor frames), receivers answer `TransferDone` or `Abort`, and both sides
send `Heartbeat`s listing the requests they still hold.

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

from kvtransfer.codec import encode, message
from kvtransfer.resharding import check_tp_pair

PROTOCOL_VERSION = 1

# [num_blocks, block_size, num_kv_heads, head_dim] per layer, K and V separate (engine/kv_cache.py).
PAGED_LAYOUT = "blocks,block_size,kv_heads,head_dim"


class IncompatiblePeerError(RuntimeError):
    """The peer speaks another protocol version or holds a cache of another shape/model/dtype."""


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


@message
class Heartbeat:
    """Either way, every heartbeat interval: the requests the sending side still holds."""

    request_ids: tuple[str, ...]


def check_hello(hello: Hello, local: KVSpec, local_tp: int) -> None:
    """Raise `IncompatiblePeerError` naming what differs, or return if the peer may send to us."""
    if hello.version != PROTOCOL_VERSION:
        raise IncompatiblePeerError(f"protocol version {hello.version} != ours {PROTOCOL_VERSION}")
    if hello.compat_hash != compat_hash(local):
        diffs = [
            f"{name}: peer {getattr(hello.spec, name)!r} != ours {getattr(local, name)!r}"
            for name in KVSpec.__dataclass_fields__
            if getattr(hello.spec, name) != getattr(local, name)
        ]
        raise IncompatiblePeerError("incompatible KV cache: " + ("; ".join(diffs) or "compat hash differs"))
    check_tp_pair(local.num_kv_heads, hello.tp_size, local_tp)


# ---- requests in, token deltas out (the workers' control and token-stream messages) ----
#
#   router ── GenerateRequest ──► decode.reserve ──► DecodeReservation | ReserveRefused
#   router ── PrefillTask ──────► prefill ══ KV ══► decode
#   prefill ── FirstToken | PrefillFailed ──► decode inbox (ZMQ PUSH/PULL)
#   prefill ── TokenDelta(first token) ──► token stream;  decode ── TokenDelta ... finished ──► token stream


@message
class SamplingSpec:
    """engine.SamplingParams on the wire (n is fanned out before: one request, one sequence)."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    max_tokens: int | None = 16
    min_tokens: int = 0
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    logprobs: int | None = None
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True


@message
class GenerateRequest:
    request_id: str
    prompt_token_ids: tuple[int, ...]
    sampling: SamplingSpec
    stream_address: str  # the token-stream consumer's PULL socket
    # The router found no prefill worker able to take it (dead, restarting, draining, far behind):
    # the decode worker prefills the prompt itself, whatever its local_prefill_threshold.
    local_prefill: bool = False


@message
class DecodeReservation:
    """Decode's answer to a reserve: where the prompt's KV goes, or that decode prefills it itself."""

    request_id: str
    prefill_locally: bool  # short uncached prompt: decode computes it, no prefill worker involved
    kv_address: str = ""  # the decode receiver's address
    inbox_address: str = ""  # decode's PULL socket for FirstToken / PrefillFailed
    block_ids: tuple[int, ...] = ()  # destination blocks, for prompt blocks num_cached_blocks onwards
    num_cached_blocks: int = 0  # leading prompt blocks decode already holds (its prefix cache)
    # Tensor-parallel decode: every rank's receiver address, rank order (kv_addresses[0] == kv_address),
    # each rank takes its own KV heads into the same block ids. Empty: one rank, at kv_address.
    kv_addresses: tuple[str, ...] = ()
    tp_size: int = 1

    def rank_addresses(self) -> tuple[str, ...]:
        """The decode ranks' KV addresses, rank order (one entry for a TP=1 decode worker)."""
        return self.kv_addresses or (self.kv_address,)


@message
class ReserveRefused:
    request_id: str
    reason: str
    retryable: bool  # True: no free blocks now; False: the request can never run here


@message
class PrefillTask:
    request: GenerateRequest
    reservation: DecodeReservation


@message
class FirstToken:
    request_id: str
    token_id: int


@message
class PrefillFailed:
    request_id: str
    reason: str


@message
class TokenLogprob:
    """One output token's logprob under the raw distribution, and the top alternatives (token id, logprob)."""

    logprob: float
    top: tuple[tuple[int, float], ...] = ()


@message
class TokenDelta:
    """New output tokens of one request; the last one has `finished` and the usage counts."""

    request_id: str
    first_index: int  # output index of token_ids[0]: deltas from prefill and decode may cross
    token_ids: tuple[int, ...]
    finished: bool = False
    finish_reason: str | None = None  # "stop", "length" or "abort"
    num_prompt_tokens: int = 0
    num_output_tokens: int = 0
    num_cached_tokens: int = 0
    error: str = ""  # why an aborted request ended, when not by the client
    logprobs: tuple[TokenLogprob, ...] = ()  # one per token id, when the request asked for logprobs
    # An abort the worker could not help (its step failed): another worker may resume the request.
    resumable: bool = False


@message
class WorkerLoad:
    """What routing needs from a worker."""

    name: str
    waiting: int  # queued for compute, or for KV
    running: int
    transferring: int  # prefill: requests whose KV is still moving
    free_blocks: int
    total_blocks: int
    prefix_cache_hit_rate: float
    # Decode: KV transfers received since the worker started (tensor parallel: rank 0's heads only),
    # their bytes, and the sum of their durations (first landed chunk to last). Prefill: zeros.
    kv_transfers: int = 0
    kv_transfer_bytes: int = 0
    kv_transfer_seconds: float = 0.0
    # Liveness, answered by the worker's I/O thread while its loop may be inside a long step:
    # steps finished since start, how long the step in progress has run (0: between steps), the
    # longest step so far, and steps that failed in a row (a sticky device error keeps failing).
    steps: int = 0
    step_running_s: float = 0.0
    longest_step_s: float = 0.0
    failed_steps_in_a_row: int = 0



# ---- the router's calls to a worker (runtime.control_service / kvtransfer.control_client) ----
#
#   router DEALER ── ControlCall(call_id, "reserve" | "prefill" | "abort" | "load", payload) ──► worker ROUTER
#   router DEALER ◄── ControlReply(call_id, payload | error) ── worker (in any order: matched by call_id)


@message
class ControlCall:
    call_id: int
    method: str
    payload: bytes | str | None  # what the Ray actor method of the same name takes (msgpack bytes or an id)


@message
class ControlReply:
    call_id: int
    payload: bytes | str | None = None
    error: str = ""  # set when the call failed
    rejected: bool = False  # the call's own fault (bad payload, unknown method): the worker is fine

# ---- inside one tensor-parallel worker: rank 0 and its follower ranks' I/O threads ----
#
#   rank 0 ── ReportTo | ExpectShard | DropShard ──► follower control PULL   (acked: RankAck)
#   rank 0 ◄── RankAck | ShardEnded ── follower                               (ZMQ PUSH/PULL)
#   prefill rank 0 ── ShardOrders ──► followers, attached to the step broadcast (engine StepHeader)


@message
class RankEndpoint:
    """Where a follower rank listens: its control socket, and (decode) its KV receiver."""

    rank: int
    control_address: str
    kv_address: str = ""


@message
class ReportTo:
    """Rank 0 to a follower, first: push your acks and reports to this address."""

    address: str


@message
class ExpectShard:
    """Decode rank 0 to a follower: expect the request's KV (your heads) into these block ids."""

    request_id: str
    block_ids: tuple[int, ...]


@message
class DropShard:
    """Rank 0 to a follower: stop receiving (decode) or sending (prefill) the request's KV shard."""

    request_id: str
    reason: str


@message
class RankAck:
    """A follower has applied rank 0's `kind` message (ReportTo, ExpectShard, DropShard) for the request."""

    request_id: str
    rank: int
    kind: str


@message
class ShardEnded:
    """A follower's part of a request's KV transfer ended: received all its heads, or sent to `peer`."""

    request_id: str
    rank: int
    kind: str  # "done", "failed" or "expired" (kvtransfer.connector.TransferEvent kinds)
    peer: str = ""  # prefill: the decode receiver's address
    reason: str = ""


@message
class ShardOrder:
    """One request whose KV a prefill forward completes: each prefill rank sends its pieces of it."""

    request_id: str
    src_block_ids: tuple[int, ...]
    reservation: DecodeReservation


@message
class ShardOrders:
    orders: tuple[ShardOrder, ...]
