"""A decode follower rank: receives this rank's KV heads, straight from the prefill ranks, on its I/O thread.

Rank 0 sends `ExpectShard(request, block ids)` when it reserves (and answers
the router only once every rank acknowledged), so the reservation exists here
before the prefill worker learns the address; each transfer's end goes back as
a `TransferEnded` report. The blocks belong to rank 0's engine (this rank's cache
mirrors its layout): once `DropShard` is acknowledged, or a `failed` report is
sent, nothing here writes into them. Writes land while the forward thread runs
other requests' steps: no running request's block table points at reserved blocks.
"""

from __future__ import annotations

from decode_worker.kv_receiving import ExpectKV, KVReceiving
from engine.parallel.follower import TPFollower
from wire.codec import encode
from runtime.engine_bridge import kv_spec_for
from wire.ranks import DropShard, ExpectShard, RankEndpoint, TransferEnded
from runtime.rank_links import RankControl
from kvtransfer.receiver import KVReceiver
from runtime.follower import FollowerRole
from runtime.io_thread import IOThread
from runtime.rank_control_service import RankControlService


class DecodeFollower(FollowerRole):
    def __init__(self, config):
        self.config = config  # DecodeWorkerConfig: addresses and timeouts
        self.receiving: KVReceiving | None = None
        self.control: RankControlService | None = None

    def services(self, follower: TPFollower, io: IOThread) -> list:
        c, rank = self.config, follower.config.parallel.rank
        tp_size = follower.config.parallel.tp_size
        receiver = KVReceiver(follower.runner.kv_caches, kv_spec_for(follower.config), c.bind_address, tp_size, rank,
                              timeouts=c.timeouts)  # fmt: skip
        self.control = RankControlService(RankControl(rank, c.bind_address), io, {
            ExpectShard: lambda msg: self.receiving.expect(ExpectKV(msg.request_id, msg.block_ids)),
            DropShard: lambda msg: receiver.abort(msg.request_id, msg.reason),  # a no-op once it ended
        })  # fmt: skip
        self.receiving = KVReceiving(receiver, self._report, rank)
        return [self.control, self.receiving]

    def _report(self, event) -> None:
        if isinstance(event, TransferEnded):  # a release is acknowledged by the DropShard's ack instead
            self.control.report(event)

    def endpoint(self) -> bytes:
        rank = self.receiving.rank
        return encode(RankEndpoint(rank, self.control.control.address, self.receiving.receiver.address))

    def is_idle(self) -> bool:
        return not self.receiving.receiver.pending()
