"""The router's async token stream puts crossing deltas from two workers back in order, over real ZMQ."""

from __future__ import annotations

import asyncio

import pytest
import zmq

from wire.codec import encode
from wire.socket_security import ClusterKey, connect_secured, refusals
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
        other.put(StreamFailed("worker decode-0 failed"))
        with pytest.raises(StreamFailed):
            [c async for c in other.chunks()]
        decode.close(), prefill.close()
        await stream.close()
        return chunks

    chunks = asyncio.run(main())
    assert [t for c in chunks for t in c.token_ids] == [10, 11, 12, 13]
    assert [lp.logprob for c in chunks for lp in c.logprobs] == [-0.5, -0.1, -0.2, -0.3]
    assert chunks[-1].final.finish_reason == "length" and all(c.final is None for c in chunks[:-1])


def test_with_a_cluster_key_a_request_takes_deltas_only_from_the_workers_it_runs_on():
    """Real CURVE sockets: each worker connects with its own key. A registered worker that does not hold the
    request is refused (`wrong_sender`), one holding only the cluster key never connects, the holder's
    delta is taken."""
    key, holder, other = ClusterKey.generate(), ClusterKey.generate(), ClusterKey.generate()
    registered = {holder.public: "decode-0", other.public: "decode-1"}

    def push(sender: ClusterKey | None, delta: TokenDelta) -> zmq.Socket:
        sock = zmq.Context.instance().socket(zmq.PUSH)
        sock.setsockopt(zmq.LINGER, 0)
        connect_secured(sock, stream.address, key=key, sender=sender)
        sock.send(encode(delta))
        return sock

    async def until(counted: str, before: dict) -> None:
        while refusals().get(("token_stream", counted), 0) == before.get(("token_stream", counted), 0):
            await asyncio.sleep(0.01)

    async def main():
        await stream.start()
        outputs = stream.open("r1", senders=frozenset({"decode-0"}))  # as the dispatcher names the attempt's workers
        before = refusals()
        forged = TokenDelta("r1", 0, (66, 66), True, "length", 3, 2)
        sockets = [push(other, forged), push(None, forged)]  # None: the cluster key's holder
        await asyncio.wait_for(asyncio.gather(until("wrong_sender", before), until("unauthenticated", before)), 30)
        sockets.append(push(holder, TokenDelta("r1", 0, (5, 6), True, "length", 3, 2)))
        chunks = await asyncio.wait_for(_all(outputs.chunks()), 30)
        for sock in sockets:
            sock.close()
        await stream.close()
        return chunks

    stream = TokenStreamConsumer(key=key, senders=registered.get)
    chunks = asyncio.run(main())
    assert [t for c in chunks for t in c.token_ids] == [5, 6] and chunks[-1].final is not None


async def _all(chunks) -> list:
    return [c async for c in chunks]


def _long_prompt_delta(request_id: str, num_prompt_tokens: int = 13_000) -> TokenDelta:
    """A first-token delta with prompt logprobs as lm-eval asks them, over the stream's 4 MiB frame bound."""
    top = tuple((150_000 + j, -1.0 - j) for j in range(20))
    entries = (None, *(TokenLogprob(-0.5 - i, top, 100_000 + i) for i in range(num_prompt_tokens - 1)))
    return TokenDelta(request_id, 0, (10,), prompt_logprobs=entries)


def test_a_long_prompts_logprobs_arrive_whole_with_the_first_token_over_real_zmq():
    """As the prefill worker sends them (`TokenDelta.in_pieces`), past the frame bound that made libzmq drop the
    worker's connection; a second worker's overlapping pieces (decode computing the prompt again) change nothing."""

    async def main():
        stream = TokenStreamConsumer()
        await stream.start()
        outputs = stream.open("a")
        prefill, decode = Pushers(), Pushers()
        first = _long_prompt_delta("a")
        pieces = first.in_pieces()
        assert len(pieces) > 1
        decode.send(stream.address, pieces[1])  # another worker's piece, overlapping prefill's
        await asyncio.sleep(0.05)
        for piece in pieces:
            prefill.send(stream.address, piece)
        decode.send(stream.address, TokenDelta("a", 1, (11,), True, "length", 13_000, 2, 0))
        chunks = await asyncio.wait_for(_all(outputs.chunks()), 20)
        prefill.close(), decode.close()
        await stream.close()
        return first, chunks

    first, chunks = asyncio.run(main())
    assert [t for c in chunks for t in c.token_ids] == [10, 11]
    (whole,) = [c.prompt_logprobs for c in chunks if c.prompt_logprobs]
    assert whole == first.prompt_logprobs
    assert 10 in chunks[[bool(c.prompt_logprobs) for c in chunks].index(True)].token_ids  # with the first token


def test_one_frame_over_the_bound_is_dropped_with_its_senders_connection():
    """Why the pieces: the whole delta as one frame never reaches the router."""

    async def main():
        stream = TokenStreamConsumer()
        await stream.start()
        outputs = stream.open("a")
        prefill = Pushers()
        prefill.send(stream.address, _long_prompt_delta("a"))
        try:
            await asyncio.wait_for(_all(outputs.chunks()), 1.0)
            return False
        except asyncio.TimeoutError:
            return True
        finally:
            prefill.close()
            await stream.close()

    assert asyncio.run(main())
