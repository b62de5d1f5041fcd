"""The prefill side of the KV handoff on a worker's I/O thread: a `KVSender` and the commands that drive it.

    loop / forward thread ── StartSend(order) ──────► open this rank's transfers of the request
                          ── SendLayer(ids, layer) ─► ship that layer of those requests (its KV is final)
                          ── Release(id, reason) ───► abort its transfers, then Released back:
                                                      from then on nothing reads its blocks
    loop thread ◄── TransferEnded(id, rank, peer, done | failed | expired) ── the sender's events

The same service runs on rank 0 (reports go to its loop) and on a
tensor-parallel follower (its reports go on to rank 0). Commands run
in the order posted: a layer is sent after its transfer started, a release
after every layer queued before it. The sender never blocks (its handshakes
complete in later rounds), so neither does this thread.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable

from wire.ranks import ShardOrder, TransferEnded
from kvtransfer.sender import KVSender
from prefill_worker.pieces import start_pieces
from runtime.transfer_service import TransferService

logger = logging.getLogger("tandem.prefill")


@dataclass(frozen=True)
class StartSend:
    order: ShardOrder


@dataclass(frozen=True)
class SendLayer:
    request_ids: tuple[str, ...]
    layer: int


class KVSending(TransferService):
    def __init__(self, sender: KVSender, kv_caches, num_kv_heads: int, report: Callable[[object], None]):
        super().__init__(sender, report, sender.tp_rank)
        self.sender, self.kv_caches, self.num_kv_heads = sender, kv_caches, num_kv_heads

    def commands(self) -> dict[type, Callable]:
        return {**super().commands(), StartSend: self.start, SendLayer: self.send_layer}

    def start(self, cmd: StartSend) -> None:
        order, s = cmd.order, self.sender
        try:
            start_pieces(s, order, self.num_kv_heads, s.tp_size, s.tp_rank)
        except ValueError as err:  # a reservation that does not fit our plan
            s.abort(order.request_id, str(err))  # the pieces that did start
            self.report(TransferEnded(order.request_id, s.tp_rank, "failed", reason=f"KV transfer could not start: {err}"))

    def send_layer(self, cmd: SendLayer) -> None:
        k_cache, v_cache = self.kv_caches[cmd.layer]
        for request_id in cmd.request_ids:
            self.sender.send_layer(request_id, cmd.layer, k_cache, v_cache)
