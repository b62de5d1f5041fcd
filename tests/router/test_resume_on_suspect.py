"""A request whose only decode worker failed a call waits for it to answer again instead of failing.

The fake decode worker's connection is down (every call fails with `WorkerGone`) until its next
heartbeat, which the registry's periodic refresh sends; the dispatcher resumes the request once that
heartbeat cleared the worker's suspicion, rather than spending every resume at once.
"""

from __future__ import annotations

import asyncio

from router.control_client import WorkerGone
from wire.requests import DecodeReservation, SamplingSpec, WorkerLoad
from router.dispatch import Dispatcher
from router.policy import make_policy
from router.registry import WorkerRegistry
from router.token_stream import TokenStreamConsumer


class ReconnectingDecode:
    """Down (calls fail at once) until its next `load()`, which finds the connection back."""

    def __init__(self):
        self.down, self.failed_reserves = True, 0

    async def reserve(self, request):
        if self.down:
            self.failed_reserves += 1
            raise WorkerGone("the control connection is down (reconnecting)")
        return DecodeReservation(request.request_id, prefill_locally=True)

    async def abort(self, request_id):
        if self.down:
            raise WorkerGone("the control connection is down (reconnecting)")

    async def load(self):
        self.down = False
        return WorkerLoad("decode-0", 0, 0, 0, 40, 40, 0.0)


def test_the_request_waits_for_the_only_decode_worker_to_answer_again():
    decode = ReconnectingDecode()

    async def main():
        registry = WorkerRegistry(make_policy("round_robin"))
        registry.register("decode-0", "decode", decode)
        stream = TokenStreamConsumer()
        await stream.start()
        polls = asyncio.create_task(registry.keep_loads_fresh(0.05, 1.0))
        try:
            await asyncio.sleep(0)  # the first poll has run: the worker is up
            decode.down = True  # ... and its connection drops
            dispatcher = Dispatcher(registry, stream)
            gen = await dispatcher.start([1, 2, 3, 4], SamplingSpec(max_tokens=4))
            gen.close()
            await dispatcher.drain_aborts()
            return gen, registry.workers["decode-0"]
        finally:
            polls.cancel()
            await stream.close()

    gen, state = asyncio.run(main())
    assert decode.failed_reserves == 1 and gen.resumes == 1
    assert state.alive and not state.suspect
