"""The control plane's server and client over real loopback sockets, a small worker object behind the server.

The server is the real `runtime.control_service.ControlService` on a real I/O thread; the calls it hands on
run on a real worker loop, or, where a test needs calls to finish out of order, on a thread pool (the
service only needs somewhere to deliver each `Call`).
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
import zmq

from wire import control_sockets
from wire.codec import decode, encode
from router.control_client import CallFailed, CallRejected, CallTimedOut, ControlClient, WorkerGone, control_endpoint
from wire.control import ControlCall, ControlReply
from wire.requests import GenerateRequest, SamplingSpec, WorkerLoad
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

    def __init__(self, deliver, max_message_bytes: int = 16 << 20, address: str = "tcp://127.0.0.1:0"):
        self.board = LoadBoard("echo")
        self.board.publish(LoopSnapshot(ECHO_LOAD, True, True))
        self.io = IOThread("echo-io", lambda io: [ControlService(self.board, CALLS, deliver, io.post, address,
                                                                 max_message_bytes)])  # fmt: skip
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


def test_a_server_that_goes_away_fails_waiting_and_later_calls(pooled):
    async def main():
        client = ControlClient(pooled.address)  # the default timeout: 120 s, so only WorkerGone can fail fast
        assert await client.call("echo", "up") == "UP"
        waiting = asyncio.ensure_future(client.call("echo", "hold-until-gone"))
        await asyncio.sleep(0.05)
        pooled.close()  # its socket closes, as when the worker's process dies
        with pytest.raises(WorkerGone, match="dropped"):
            await waiting
        with pytest.raises(WorkerGone):
            await client.call("echo", "again")

    asyncio.run(main())


async def _until(predicate, what: str, timeout_s: float = 10.0):
    """Await `predicate()` (a coroutine function) until it returns something true; return that."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not (result := await predicate()):
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)
    return result


async def _gone_error(client: ControlClient) -> WorkerGone | None:
    """The WorkerGone a call gets (None if it is answered, or still waits after a second: try again)."""
    try:
        await asyncio.wait_for(client.call("echo", "anyone?"), 1.0)
    except WorkerGone as gone:
        return gone
    except asyncio.TimeoutError:
        pass
    return None


async def _answer(client: ControlClient) -> str | None:
    try:
        return await client.call("echo", "back")
    except WorkerGone:
        return None


def test_a_worker_that_closes_and_rebinds_its_port_is_reached_again(worker):
    """Closed: calls fail at once (no reply wait), soon saying the address refuses; rebound: calls work again."""
    loop = WorkerLoop("echo", LoadBoard("echo"), lambda deliver: worker)
    server = Server(loop.post)
    address = server.address

    async def main():
        nonlocal server
        client = ControlClient(address)  # 120 s timeout: a call that waited would not fail within this test
        assert await client.call("echo", "up") == "UP"
        server.close()
        first = await _until(lambda: _gone_error(client), "a call to fail while the worker is down")
        refused = await _until(lambda: _refusal(client), "the address to refuse connections")
        assert not client.up and refused.refused and "refuses connections" in str(refused)
        server = Server(loop.post, address=address)  # the same port, as a restarted worker may
        assert await _until(lambda: _answer(client), "the worker to answer again") == "BACK"
        return first, client

    try:
        first, client = asyncio.run(main())
    finally:
        server.close()
        loop.stop()
    assert isinstance(first, WorkerGone) and client.up and client.reconnects == 1


async def _refusal(client: ControlClient) -> WorkerGone | None:
    gone = await _gone_error(client)
    return gone if gone is not None and gone.refused else None


def test_a_call_made_before_the_worker_listens_waits_for_it(worker):
    with socket.create_server(("127.0.0.1", 0)) as probe:  # a free port, closed again: nobody listens there yet
        port = probe.getsockname()[1]
    loop = WorkerLoop("echo", LoadBoard("echo"), lambda deliver: worker)
    servers = []

    async def main():
        client = ControlClient(f"tcp://127.0.0.1:{port}")
        early = asyncio.ensure_future(client.call("echo", "early"))
        await asyncio.sleep(0.3)  # ZMQ retries the refused connection meanwhile; the call waits
        assert not early.done()
        servers.append(Server(loop.post, address=f"tcp://127.0.0.1:{port}"))
        return await early

    try:
        assert asyncio.run(main()) == "EARLY"
    finally:
        for server in servers:
            server.close()
        loop.stop()


# A worker's control socket that takes calls and answers none: only the connection matters here.
_FROZEN_PEER = """
import zmq
sock = zmq.Context.instance().socket(zmq.ROUTER)
sock.bind("tcp://127.0.0.1:0")
print(sock.getsockopt_string(zmq.LAST_ENDPOINT), flush=True)
while True:
    sock.recv_multipart()
"""


def test_a_stopped_peer_is_disconnected_by_the_heartbeat_and_reached_again_once_it_runs(monkeypatch):
    """SIGSTOP freezes every thread of the worker's process, ZMQ's too: the heartbeat times out (shortened
    here from 15 s), calls fail at once, and the address does not refuse (the process holds its port)."""
    monkeypatch.setattr(control_sockets, "HEARTBEAT_IVL_MS", 100)
    monkeypatch.setattr(control_sockets, "HEARTBEAT_TIMEOUT_MS", 500)
    peer = subprocess.Popen([sys.executable, "-c", _FROZEN_PEER], stdout=subprocess.PIPE, text=True)
    try:
        address = peer.stdout.readline().strip()

        async def main():
            client = ControlClient(address)
            first = asyncio.ensure_future(client.call("echo", "connect"))  # never answered
            await _until(lambda: _link_up(client), "the connection")
            os.kill(peer.pid, signal.SIGSTOP)
            await _until(lambda: _gone_error(client), "the heartbeat to drop the connection")
            assert first.done() and isinstance(first.exception(), WorkerGone)
            await asyncio.sleep(0.3)  # several reconnection attempts: the frozen process's port still accepts
            down = await _gone_error(client)  # fails at once: the connection is down
            os.kill(peer.pid, signal.SIGCONT)
            await _until(lambda: _link_up(client), "the connection to come back")
            return down, client.reconnects

        down, reconnects = asyncio.run(main())
        assert "is down (reconnecting)" in str(down) and not down.refused and reconnects == 1
    finally:
        os.kill(peer.pid, signal.SIGCONT)
        peer.kill()
        peer.wait()


async def _link_up(client: ControlClient) -> bool:
    return client.up


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
