"""A decode follower rank's I/O worker: receives this rank's KV heads, straight from the prefill ranks.

Rank 0 (`DecodeWorker.reserve`) sends `ExpectShard(request, block ids)` and
waits for the ack, so the reservation exists here before the prefill worker
learns the address; each transfer's end goes back as a `ShardEnded` report.
The blocks belong to rank 0's engine (this rank's cache mirrors its layout):
after `DropShard` is acknowledged, or a `failed` report, nothing here writes
into them. Writes land while the forward thread runs other requests' steps:
no running request's block table points at reserved blocks.

Runs on its own thread (`engine.parallel.follower_host`): the forward thread
is parked in the step broadcast, and the receiver must poll at least every
heartbeat interval.
"""

from __future__ import annotations

import logging

from engine.parallel.follower import TPFollower
from kvtransfer.codec import encode
from kvtransfer.engine_bridge import kv_spec_for
from kvtransfer.protocol import ExpectShard, RankEndpoint
from kvtransfer.rank_links import RankControl
from kvtransfer.receiver import KVReceiver

logger = logging.getLogger("tandem.decode")


class ShardReceiver:
    def __init__(self, follower: TPFollower, kv_address: str, control_address: str, timeouts):
        config = follower.config
        self.rank, tp_size = config.parallel.rank, config.parallel.tp_size
        kv_caches = follower.runner.kv_caches
        self.receiver = KVReceiver(kv_caches, kv_spec_for(config), kv_address, tp_size, self.rank, timeouts=timeouts)
        self.control = RankControl(self.rank, control_address)

    def endpoint(self) -> bytes:
        return encode(RankEndpoint(self.rank, self.control.address, self.receiver.address))

    def step(self) -> bool:
        busy = False
        for msg in self.control.poll(0):
            if isinstance(msg, ExpectShard):
                self._expect(msg)
            else:
                self.receiver.abort(msg.request_id, msg.reason)  # a no-op once it ended
            self.control.ack(msg)
            busy = True
        for event in self.receiver.poll(0):
            self.control.report(event.request_id, event.kind, reason=event.reason)
            busy = True
        return busy

    def _expect(self, msg: ExpectShard) -> None:
        try:
            self.receiver.recv(msg.request_id, msg.block_ids)
        except ValueError as err:  # a request id reused while its transfer is under way
            logger.error("rank %d cannot expect %s: %s", self.rank, msg.request_id, err)
            self.control.report(msg.request_id, "failed", reason=str(err))

    def is_idle(self) -> bool:
        return not self.receiver.pending()

    def close(self) -> None:
        self.receiver.close()
        self.control.close()
