"""A worker's control socket with a cluster key admits the router's own key only: another member (a worker,
holding the cluster key and its own sender key) can neither reserve nor abort nor point the worker's pushes
anywhere. Real sockets, real I/O thread, keys as a deployment hands them out."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

import pytest
import zmq

from router.control_client import ControlClient
from runtime.worker_config import WorkerConfig
from tests.kvtransfer.hostile import close_all, send_unless_refused, wait_refused
from tests.runtime.echo import EchoWorker, Server
from wire.codec import encode
from wire.control import ControlCall
from wire.control_sockets import control_socket
from wire.socket_security import ENV_VAR, ClusterKey, connect_secured, refusals, sender_keypair

KEY = ClusterKey.generate()
WORKER_KEY = ClusterKey.generate()  # another member's own sender key (a prefill worker's, say)


@pytest.fixture
def served(monkeypatch):
    """An echo worker whose control socket has the cluster key and knows this process as the router."""
    monkeypatch.setenv(ENV_VAR, KEY.encoded())
    worker = EchoWorker()
    with ThreadPoolExecutor(2) as pool:
        server = Server(lambda call: pool.submit(worker.handle, call), router_key=sender_keypair().public)
        yield server, worker
        server.close()


def _member_calls(address: str, sender: ClusterKey | None, method: str, arg) -> zmq.Socket:
    """A DEALER holding the cluster key (presenting `sender`'s key instead when given) that sends one call."""
    sock = control_socket(zmq.Context.instance(), zmq.DEALER)
    connect_secured(sock, address, key=KEY, sender=sender)
    send_unless_refused(sock, encode(ControlCall(1, method, arg)))
    return sock


@pytest.mark.parametrize("sender", [None, WORKER_KEY], ids=["cluster_key", "worker_sender_key"])
def test_a_member_that_is_not_the_router_is_refused_and_its_calls_never_reach_the_worker(served, sender):
    server, worker = served
    before = refusals()
    member = _member_calls(server.address, sender, "abort", "someone-elses-request")
    assert member.poll(1000, zmq.POLLIN) == 0  # never answered
    wait_refused(refusals, before, "control", reasons=("unauthenticated",))
    assert worker.aborted == []

    async def as_router():
        client = ControlClient(server.address, timeout_s=10)
        try:
            return await client.call("echo", "from the router")
        finally:
            client.close()

    assert asyncio.run(as_router()) == "FROM THE ROUTER"
    close_all([member])


def test_a_worker_with_a_cluster_key_but_no_router_key_is_refused_at_config():
    with pytest.raises(ValueError, match="router's key"):
        WorkerConfig("decode-0", cluster_key=KEY.encoded())
