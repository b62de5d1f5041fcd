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
from runtime.engine_bridge import kv_spec_for
from wire.ranks import DropShard, ExpectShard
from runtime.rank_links import RankControl
from kvtransfer.receiver import KVReceiver
from runtime.follower import FollowerRole
from runtime.io_thread import IOThread
from runtime.rank_control_service import RankControlService


class DecodeFollower(FollowerRole):
    def services(self, follower: TPFollower, io: IOThread) -> list:
        c, p = self.config, follower.config.parallel
        receiver = KVReceiver(follower.runner.kv_caches, kv_spec_for(follower.config), c.bind_address, p.tp_size,
                              p.rank, timeouts=c.timeouts)  # fmt: skip
        self.control = RankControlService(RankControl(p.rank, c.bind_address, self.leader_key), io, {
            ExpectShard: lambda msg: self.kv.expect(ExpectKV(msg.request_id, msg.block_ids, msg.transfer_token)),
            DropShard: lambda msg: receiver.abort(msg.request_id, msg.reason),  # a no-op once it ended
        })  # fmt: skip
        self.kv = KVReceiving(receiver, self.control.report, p.rank)
        return [self.control, self.kv]

    def endpoint(self) -> bytes:
        return self.rank_endpoint(self.kv.receiver.address)
