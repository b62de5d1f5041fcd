"""The control plane's server and client over real loopback sockets, a small worker object behind the server.

The server is the real `runtime.control_service.ControlService` on a real I/O thread; the calls it hands on
run on a real worker loop, or, where a test needs calls to finish out of order, on a thread pool (the
service only needs somewhere to deliver each `Call`).
"""

from __future__ import annotations

import asyncio
import dataclasses

import pytest
import zmq

from wire.codec import decode, encode
from router.control_client import CallFailed, CallRejected, CallTimedOut, ControlClient, WorkerGone, control_endpoint
from wire.control import ControlCall, ControlReply
from wire.requests import GenerateRequest, SamplingSpec
from router.policy import make_policy
from router.registry import WorkerFailed, WorkerRegistry
from runtime.load_board import LoadBoard
from runtime.loop import WorkerLoop
from tests.e2e.harness import wait_for

from tests.runtime.echo import ECHO_LOAD, Server


def test_calls_through_the_endpoint_interface(looped, worker):
    async def main():
        endpoint = control_endpoint(looped.address)
        load = await endpoint.load()
        await endpoint.abort("req-7")
        return load

    # Refusals are this process's (wire.socket_security), counted by whatever tests ran in it before.
    assert dataclasses.replace(asyncio.run(main()), refused=()) == ECHO_LOAD
    assert worker.aborted == ["req-7"]


def test_replies_finishing_out_of_order_reach_their_own_calls(pooled):
    async def main():
        client = ControlClient(pooled.address)
        held = asyncio.ensure_future(client.call("echo", "hold-a"))
        await asyncio.sleep(0.05)  # let the held call reach the worker first (not needed for correctness)
        released = await client.call("echo", "release")
        return released, await held, client

    released, held, client = asyncio.run(main())
    assert (released, held) == ("RELEASE", "HOLD-A")
    assert client.late_replies == 0


def test_worker_errors_and_bad_calls_raise_their_kinds(looped):
    async def main():
        client = ControlClient(looped.address)
        with pytest.raises(CallFailed, match="the worker broke"):
            await client.call("echo", "fail")
        with pytest.raises(CallRejected, match="echo takes a string"):
            await client.call("echo", None)
        with pytest.raises(CallRejected, match="unknown method"):
            await client.call("shutdown", None)
        return await client.call("echo", "still here")

    assert asyncio.run(main()) == "STILL HERE"
    assert looped.rejected == 2


def test_a_call_without_reply_times_out_and_its_late_reply_is_dropped(pooled, worker):
    async def main():
        client = ControlClient(pooled.address, timeout_s=0.2)
        with pytest.raises(CallTimedOut):
            await client.call("echo", "hold-forever")
        worker.release.set()
        for _ in range(200):
            if client.late_replies:
                break
            await asyncio.sleep(0.01)
        return client.late_replies, await client.call("echo", "next")

    assert asyncio.run(main()) == (1, "NEXT")


def test_garbage_is_dropped_and_counted_and_the_server_keeps_serving(looped):
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(looped.address)
    sock.send(b"\xc1 not msgpack")
    sock.send_multipart([b"two", b"frames"])
    sock.send(encode(ControlReply(1, "a reply is no call")))
    sock.send(encode(ControlCall(2, "echo", 3)))  # payload of a type no call takes
    wait_for(lambda: looped.dropped == 4, "the server to drop the four messages")
    sock.send(encode(ControlCall(3, "echo", "fine")))
    assert sock.poll(10_000)
    assert decode(sock.recv(), ControlReply) == ControlReply(3, "FINE")
    sock.close()


def test_a_message_over_the_size_limit_never_reaches_the_worker(worker):
    loop = WorkerLoop("echo", LoadBoard("echo"), lambda deliver: worker)
    server = Server(loop.post, max_message_bytes=1024)

    async def main():
        big = ControlClient(server.address, timeout_s=5.0)
        with pytest.raises((WorkerGone, CallTimedOut)):  # ZMQ cuts the connection of a peer sending too much
            await big.call("echo", "x" * 4096)
        return await ControlClient(server.address).call("echo", "small")

    try:
        assert asyncio.run(main()) == "SMALL"
    finally:
        server.close()
        loop.stop()


def test_a_failed_or_timed_out_call_makes_the_worker_suspect_not_dead_and_a_rejection_does_neither(looped, worker):
    failing = Server(lambda call: call.answer(None, RuntimeError("the worker is stopping")))  # as a dying worker's
    hung = Server(lambda call: None)  # takes calls, never answers

    async def main():
        registry = WorkerRegistry(make_policy("round_robin"))
        states = {name: registry.register(name, "decode", control_endpoint(server.address, timeout_s=0.5))
                  for name, server in (("healthy", looped), ("failing", failing), ("hung", hung))}  # fmt: skip
        request = GenerateRequest("r-1", (1, 2, 3), SamplingSpec(), "tcp://127.0.0.1:1")
        with pytest.raises(CallRejected, match="unknown method"):  # the echo worker has no `reserve`
            await states["healthy"].endpoint.reserve(request)
        for name in ("failing", "hung"):
            with pytest.raises(WorkerFailed):
                await states[name].endpoint.abort("r-1")
        return {name: (state.alive, state.suspect) for name, state in states.items()}

    try:
        alive = {"healthy": (True, False), "failing": (True, True), "hung": (True, True)}
        assert asyncio.run(main()) == alive
    finally:
        failing.close()
        hung.close()


def test_unregistering_a_worker_closes_its_control_socket(looped):
    async def main():
        registry = WorkerRegistry(make_policy("round_robin"))
        endpoint = control_endpoint(looped.address)
        registry.register("w", "decode", endpoint)
        await registry.workers["w"].endpoint.load()  # connected
        registry.unregister("w")
        with pytest.raises(WorkerGone, match="closed"):
            await endpoint.load()

    asyncio.run(main())
