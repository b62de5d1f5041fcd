"""The control connection's life: a worker that goes away, rebinds, starts late or is stopped; the
client fails fast while it is down and reaches it again once it is back."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys

import pytest

from wire import control_sockets
from router import control_client
from router.control_client import ControlClient, WorkerGone, control_endpoint
from runtime.load_board import LoadBoard
from runtime.loop import WorkerLoop

from tests.runtime.echo import Server


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


def test_aborts_that_fail_while_the_worker_is_down_reach_it_once_it_is_back(worker, monkeypatch):
    """An abort is never lost to a dropped connection: the endpoint keeps it (the newest ones, up to its bound)
    and sends it on the next connection; a closed endpoint keeps none."""
    monkeypatch.setattr(control_client, "MAX_UNDELIVERED_ABORTS", 2)
    loop = WorkerLoop("echo", LoadBoard("echo"), lambda deliver: worker)
    server = Server(loop.post)
    address = server.address

    async def main():
        nonlocal server
        endpoint, closed = control_endpoint(address), control_endpoint(address)
        for connected in (endpoint, closed):
            assert (await connected.load()).name == "echo"
        server.close()
        for request_id in ("r-0", "r-1", "r-2"):
            await _until(lambda: _abort_fails(endpoint, request_id), f"the abort of {request_id} to fail")
        await _until(lambda: _abort_fails(closed, "r-closed"), "the abort of r-closed to fail")
        closed.close()  # the worker left the registry: what it kept is nobody's business any more
        assert closed.undelivered_aborts == {}
        assert list(endpoint.undelivered_aborts) == ["r-1", "r-2"] and endpoint.dropped_aborts == 1
        server = Server(loop.post, address=address)
        await _until(lambda: _aborted(worker, 2), "the kept aborts to reach the worker")
        await endpoint.load()  # answered after the aborts sent before it: nothing more comes
        endpoint.close()
        return sorted(worker.aborted), endpoint.undelivered_aborts

    try:
        aborted, kept = asyncio.run(main())
    finally:
        server.close()
        loop.stop()
    assert aborted == ["r-1", "r-2"] and kept == {}


async def _abort_fails(endpoint, request_id: str) -> bool:
    try:
        await asyncio.wait_for(endpoint.abort(request_id), 1.0)
    except WorkerGone:
        return True
    except asyncio.TimeoutError:
        pass
    return False


async def _aborted(worker, count: int) -> bool:
    return len(worker.aborted) >= count
