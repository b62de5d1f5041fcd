"""A prefill follower rank: sends this rank's KV heads of each finished prompt to decode, from its I/O thread.

Rank 0 attaches `ShardOrders` to the step broadcast of each forward that
completes prompts. On the forward thread this rank's connector turns them into
`StartSend` commands and each layer, as its KV is written, into `SendLayer`;
the I/O thread opens this rank's transfers (`start_pieces`), sends the layers,
and reports each transfer's end to rank 0 (`TransferEnded`).

Ownership: the source blocks are rank 0's (this rank's cache mirrors its
layout); rank 0 frees them only after every rank reported every transfer's
end, or acknowledged a `DropShard` (which aborts ours). A drop is applied
after the commands the forward thread queued before rank 0 sent it
(`runtime.rank_control_service`), so it never overtakes its order.
"""

from __future__ import annotations

from engine.parallel.follower import TPFollower
from wire.codec import decode
from runtime.engine_bridge import kv_spec_for
from wire.ranks import DropShard, ShardOrders
from runtime.rank_links import RankControl
from kvtransfer.sender import KVSender
from prefill_worker.kv_sending import KVSending, SendLayer, StartSend
from runtime.follower import FollowerRole
from runtime.io_thread import IOThread
from runtime.rank_control_service import RankControlService


class _ForwardConnector:
    """The forward thread's side (`engine.kv_connector.FollowerConnector`): commands for the I/O thread."""

    def __init__(self, io: IOThread):
        self.io = io
        self._step_requests: tuple[str, ...] = ()

    def on_step(self, attachment: bytes) -> None:
        orders = decode(attachment, ShardOrders).orders if attachment else ()
        self._step_requests = tuple(order.request_id for order in orders)
        for order in orders:
            self.io.post(StartSend(order))

    def save_layer(self, layer: int) -> None:
        if self._step_requests:
            self.io.post(SendLayer(self._step_requests, layer))


class PrefillFollower(FollowerRole):
    def services(self, follower: TPFollower, io: IOThread) -> list:
        c, p, heads = self.config, follower.config.parallel, follower.config.model.num_kv_heads
        sender = KVSender(kv_spec_for(follower.config), c.name, p.tp_size, p.rank, timeouts=c.timeouts)
        self.control = RankControlService(RankControl(p.rank, c.bind_address, self.leader_key), io, {
            DropShard: lambda msg: sender.abort(msg.request_id, msg.reason),  # after the commands queued before it
        })  # fmt: skip
        self.kv = KVSending(sender, follower.runner.kv_caches, heads, self.control.report)
        return [self.control, self.kv]

    def connector(self, follower: TPFollower, io: IOThread) -> _ForwardConnector:
        return _ForwardConnector(io)

    def endpoint(self) -> bytes:
        return self.rank_endpoint()
