"""The control plane's server and client over real loopback sockets, a small worker object behind the server.

The server is the real `runtime.control_service.ControlService` on a real I/O thread; the calls it hands on
run on a real worker loop, or, where a test needs calls to finish out of order, on a thread pool (the
service only needs somewhere to deliver each `Call`).
"""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
import zmq

from kvtransfer.codec import decode, encode
from kvtransfer.control_client import CallFailed, CallRejected, CallTimedOut, ControlClient, WorkerGone, control_endpoint
from kvtransfer.protocol import ControlCall, ControlReply, GenerateRequest, SamplingSpec, WorkerLoad
from router.policy import make_policy
from router.registry import WorkerFailed, WorkerRegistry
from runtime.control_service import ControlService, request_id_arg
from runtime.io_thread import IOThread
from runtime.load_board import LoadBoard, LoopSnapshot
from runtime.loop import CallsOnlyWorker, WorkerLoop
from tests.e2e.harness import wait_for

ECHO_LOAD = WorkerLoad("echo", 1, 2, 0, 30, 40, 0.5)


class EchoWorker(CallsOnlyWorker):
    """Answers `echo` calls; `hold` blocks until `release` is set (from another call, or the test)."""

    load = ECHO_LOAD

    def __init__(self):
        self.release = threading.Event()
        self.aborted: list[str] = []

    def echo(self, text: str) -> str:
        if text.startswith("hold"):
            self.release.wait(10)
        if text == "release":
            self.release.set()
        if text == "fail":
            raise RuntimeError("the worker broke")
        return text.upper()

    def abort(self, request_id: str) -> None:
        self.aborted.append(request_id)


def _echo_arg(text):
    if not isinstance(text, str):
        raise ValueError("echo takes a string")
    return text


CALLS = {"echo": _echo_arg, "abort": request_id_arg}


class Server:
    """A control service on its own I/O thread, delivering calls to `deliver`."""

    def __init__(self, deliver, max_message_bytes: int = 16 << 20):
        self.board = LoadBoard("echo")
        self.board.publish(LoopSnapshot(ECHO_LOAD, True, True))
        self.io = IOThread("echo-io", lambda io: [ControlService(self.board, CALLS, deliver, io.post,
                                                                 max_message_bytes=max_message_bytes)])  # fmt: skip
        self.service = self.io.services[0]
        self.address = self.service.address

    @property
    def rejected(self) -> int:
        return self.service.rejected

    @property
    def dropped(self) -> int:
        return self.service.dropped

    def close(self) -> None:
        """Its socket closes, as when the worker's process dies."""
        self.io.stop()


@pytest.fixture
def worker():
    w = EchoWorker()
    yield w
    w.release.set()


@pytest.fixture
def looped(worker):
    """A server in front of `worker` on a real worker loop."""
    loop = WorkerLoop("echo", LoadBoard("echo"), lambda deliver: worker)
    server = Server(loop.post)
    yield server
    server.close()
    loop.stop()


@pytest.fixture
def pooled(worker):
    """A server whose calls run on two threads, so they may finish in any order."""
    with ThreadPoolExecutor(2) as pool:
        server = Server(lambda call: pool.submit(worker.handle, call))
        yield server
        server.close()
        worker.release.set()


def test_calls_through_the_endpoint_interface(looped, worker):
    async def main():
        endpoint = control_endpoint(looped.address)
        load = await endpoint.load()
        await endpoint.abort("req-7")
        return load

    assert asyncio.run(main()) == ECHO_LOAD
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
            await client.call("echo", b"bytes")
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


def test_a_server_that_goes_away_fails_waiting_and_later_calls(pooled):
    async def main():
        client = ControlClient(pooled.address)
        assert await client.call("echo", "up") == "UP"
        waiting = asyncio.ensure_future(client.call("echo", "hold-until-gone"))
        await asyncio.sleep(0.05)
        pooled.close()  # its socket closes, as when the worker's process dies
        with pytest.raises(WorkerGone):
            await waiting
        with pytest.raises(WorkerGone):
            await client.call("echo", "again")

    asyncio.run(main())


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


def test_the_registry_marks_a_worker_dead_on_failure_and_timeout_but_not_on_rejection(looped, worker):
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
        return {name: state.alive for name, state in states.items()}

    try:
        assert asyncio.run(main()) == {"healthy": True, "failing": False, "hung": False}
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
