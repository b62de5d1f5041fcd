"""The router's async token stream puts crossing deltas from two workers back in order, over real ZMQ."""

from __future__ import annotations

import asyncio

import pytest

from wire.requests import TokenDelta, TokenLogprob
from wire.push_pull import Pushers
from router.token_stream import StreamFailed, TokenStreamConsumer


def test_deltas_arriving_out_of_order_come_out_in_order():
    async def main():
        stream = TokenStreamConsumer()
        await stream.start()
        outputs, other = stream.open("a"), stream.open("b")
        decode, prefill = Pushers(), Pushers()
        # Decode's tokens 1-3 and the final delta overtake prefill's first token.
        decode.send(stream.address, TokenDelta("a", 1, (11, 12), logprobs=(TokenLogprob(-0.1), TokenLogprob(-0.2))))
        decode.send(stream.address, TokenDelta("a", 3, (13,), True, "length", 5, 4, 0, logprobs=(TokenLogprob(-0.3),)))
        decode.send(stream.address, TokenDelta("gone", 0, (1,)))  # nobody waits for it: dropped
        await asyncio.sleep(0.05)
        prefill.send(stream.address, TokenDelta("a", 0, (10,), logprobs=(TokenLogprob(-0.5),)))
        chunks = [c async for c in outputs.chunks()]
        stream.fail("b", "worker decode-0 failed")
        with pytest.raises(StreamFailed):
            [c async for c in other.chunks()]
        decode.close(), prefill.close()
        await stream.close()
        return chunks

    chunks = asyncio.run(main())
    assert [t for c in chunks for t in c.token_ids] == [10, 11, 12, 13]
    assert [lp.logprob for c in chunks for lp in c.logprobs] == [-0.5, -0.1, -0.2, -0.3]
    assert chunks[-1].final.finish_reason == "length" and all(c.final is None for c in chunks[:-1])
