"""Which KV pieces a prefill rank sends for one request, and which (rank, receiver) transfers make it whole.

A prefill worker at TP=a sends to a decode worker at TP=b (the reservation says
b and every decode rank's address): `kvtransfer.resharding.plan` cuts the
request's KV into pieces, each from one prefill rank to one decode rank. Rank 0
and every follower call `start_pieces` with their own rank; rank 0 frees the
request's blocks once every transfer of `transfers_of` has ended.
"""

from __future__ import annotations

from kvtransfer.connector import PeerTarget
from wire.ranks import ShardOrder
from kvtransfer.resharding import pieces_from, plan
from kvtransfer.sender import KVSender


def _addresses(order: ShardOrder) -> tuple[str, ...]:
    res = order.reservation
    addresses = res.rank_addresses()
    if len(addresses) != res.tp_size:
        raise ValueError(f"decode reservation of TP={res.tp_size} lists {len(addresses)} KV addresses")
    return addresses


def transfers_of(order: ShardOrder, num_kv_heads: int, src_tp: int) -> set[tuple[int, str]]:
    """Every (prefill rank, decode address) transfer of the request."""
    addresses = _addresses(order)
    return {(p.src_rank, addresses[p.dst_rank]) for p in plan(num_kv_heads, src_tp, order.reservation.tp_size)}


def start_pieces(sender: KVSender, order: ShardOrder, num_kv_heads: int, src_tp: int, src_rank: int) -> None:
    """Open this rank's transfers of the request (its layers follow with `sender.send_layer`); never waits.

    Raises ValueError when the reservation does not fit the plan; a receiver that refuses or does not
    answer ends its transfer with a `failed` event later."""
    addresses, res = _addresses(order), order.reservation
    for piece in pieces_from(num_kv_heads, src_tp, src_rank, res.tp_size):
        target = PeerTarget.from_piece(piece, addresses[piece.dst_rank], res.block_ids, res.transfer_token)
        sender.send(order.request_id, order.src_block_ids, target)
