"""A prefill follower rank's I/O worker: sends this rank's KV heads of each finished prompt to decode.

Rank 0 attaches `ShardOrders` to the step broadcast of each forward that
completes prompts. On the forward thread, `on_step` queues the orders and the
layer hook queues each layer as its KV is written; the I/O thread (its own, as
the sender must poll at least every heartbeat interval while the forward
thread waits in the broadcast) opens this rank's transfers (`start_pieces`),
sends the layers, and reports each transfer's end to rank 0 (`ShardEnded`).

Ownership: the source blocks are rank 0's (this rank's cache mirrors its
layout); rank 0 frees them only after every rank reported every transfer's
end, or after a `DropShard` (which aborts ours: the receiver then drops what
is still queued). Control messages are applied after the commands the forward
thread queued before rank 0 sent them, so a drop never overtakes its order.
"""

from __future__ import annotations

import logging
import queue

from engine.layer_hook import install_layer_hook
from engine.parallel.follower import TPFollower
from kvtransfer.codec import decode, encode
from kvtransfer.engine_bridge import kv_spec_for
from kvtransfer.protocol import IncompatiblePeerError, RankEndpoint, ShardOrders
from kvtransfer.rank_links import RankControl
from kvtransfer.sender import KVSender
from prefill_worker.pieces import start_pieces

logger = logging.getLogger("tandem.prefill")


class ShardSender:
    def __init__(self, follower: TPFollower, name: str, control_address: str, timeouts):
        config = follower.config
        self.rank, self.tp_size = config.parallel.rank, config.parallel.tp_size
        self.num_kv_heads, self.kv_caches = config.model.num_kv_heads, follower.runner.kv_caches
        self.sender = KVSender(kv_spec_for(config), name, self.tp_size, self.rank, timeouts=timeouts)
        self.control = RankControl(self.rank, control_address)
        self._commands: queue.SimpleQueue = queue.SimpleQueue()  # forward thread -> I/O thread
        self._step_requests: tuple[str, ...] = ()  # forward thread's: requests this forward completes
        follower.on_step = self._on_step
        install_layer_hook(follower.runner, self._on_layer)

    def endpoint(self) -> bytes:
        return encode(RankEndpoint(self.rank, self.control.address))

    # ---- forward thread -----------------------------------------------------
    def _on_step(self, attachment: bytes) -> None:
        orders = decode(attachment, ShardOrders).orders if attachment else ()
        self._step_requests = tuple(order.request_id for order in orders)
        if orders:
            self._commands.put(("start", orders))

    def _on_layer(self, layer: int) -> None:
        if self._step_requests:
            self._commands.put(("layer", self._step_requests, layer))

    # ---- I/O thread ---------------------------------------------------------
    def step(self) -> bool:
        busy = self._run_commands()
        for msg in self.control.poll(0):
            self._run_commands()  # whatever the forward thread queued before rank 0 sent this
            self.sender.abort(msg.request_id, msg.reason)  # DropShard
            self.control.ack(msg)
            busy = True
        for event in self.sender.poll(0):
            self.control.report(event.request_id, event.kind, event.peer, event.reason)
            busy = True
        return busy

    def _run_commands(self) -> bool:
        ran = False
        while True:
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                return ran
            ran = True
            if command[0] == "layer":
                self._send_layer(*command[1:])
            else:
                for order in command[1]:
                    self._start(order)

    def _start(self, order) -> None:
        try:
            start_pieces(self.sender, order, self.num_kv_heads, self.tp_size, self.rank)
        except (IncompatiblePeerError, ConnectionError, ValueError) as err:
            self.sender.abort(order.request_id, str(err))
            self.control.report(order.request_id, "failed", reason=f"KV transfer could not start: {err}")

    def _send_layer(self, request_ids: tuple[str, ...], layer: int) -> None:
        k_cache, v_cache = self.kv_caches[layer]
        for request_id in request_ids:
            self.sender.send_layer(request_id, layer, k_cache, v_cache)

    def is_idle(self) -> bool:
        return self._commands.empty() and not self.sender.pending()

    def close(self) -> None:
        self.sender.close()
        self.control.close()
