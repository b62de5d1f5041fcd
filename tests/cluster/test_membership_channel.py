"""The controller↔router channel through real sockets (no Ray): the controller's `MembershipService`
and the router's `RouterSync`, CURVE-secured with a cluster key and admitting the router's own key only,
through a controller restart."""

from __future__ import annotations

import asyncio
import threading

import pytest
import zmq

from cluster.membership import Membership
from cluster.membership_service import MembershipService
from cluster.router_sync import RouterSync
from router.policy import make_policy
from router.registry import WorkerRegistry
from tests.cluster.fakes import FakeWorker
from tests.kvtransfer.hostile import close_all, send_unless_refused, wait_refused
from wire.codec import encode
from wire.control import ControlCall
from wire.control_sockets import control_socket
from wire.membership import MemberView, MembershipReport
from wire.socket_security import ClusterKey, connect_secured, refusals, sender_keypair


class Controller:
    """One incarnation of the controller's side: its membership and the socket that serves it."""

    def __init__(self, key: ClusterKey, workers: list[FakeWorker] = ()):
        self.membership = Membership(ack_timeout_s=20.0, poll_s=0.05)
        self.membership.adopt(list(workers))
        # This process is the router: RouterSync presents its sender key, as the serving process does.
        self.service = MembershipService(self.membership, key, sender_keypair().public)


async def _until(condition, timeout_s: float = 20.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.02)


def test_the_router_follows_the_controller_over_its_socket_and_through_its_restart():
    key = ClusterKey.generate()
    registry = WorkerRegistry(make_policy("round_robin"))
    current = {"controller": Controller(key)}

    async def locate() -> str:
        return current["controller"].service.address

    totals = {"ttft": (3.0, 2.0), "tpot": (0.5, 10.0)}
    sync = RouterSync(registry, locate, lambda: totals, key=key, retry_s=0.05)

    async def scenario() -> None:
        task = asyncio.create_task(sync.run())
        first = current["controller"]
        worker = FakeWorker("decode-0", "decode")
        registered = threading.Thread(target=first.membership.register, args=(worker,))
        registered.start()  # returns once a report shows the router applied it
        await _until(lambda: not registered.is_alive())
        assert list(registry.workers) == ["decode-0"]
        assert registry.workers["decode-0"].endpoint._endpoint.client.address == worker.control_address
        assert "decode-0" in first.membership.snapshot()
        assert first.membership.latency_totals == totals
        held = registry.workers["decode-0"]

        first.service.close()  # the controller dies; the restarted one adopts the same worker, on a new port
        current["controller"] = restarted = Controller(key, [worker])
        await _until(lambda: "decode-0" in restarted.membership.snapshot())
        assert registry.workers["decode-0"] is held  # same incarnation: the router changed nothing

        drained = threading.Thread(target=restarted.membership.drain, args=("decode-0",))
        drained.start()
        await _until(lambda: not drained.is_alive())
        assert registry.workers["decode-0"].draining
        task.cancel()
        restarted.service.close()

    asyncio.run(asyncio.wait_for(scenario(), 60))


def test_a_router_without_the_cluster_key_is_never_answered():
    controller = Controller(ClusterKey.generate(), [FakeWorker("prefill-0", "prefill")])
    registry = WorkerRegistry(make_policy("round_robin"))

    async def locate() -> str:
        return controller.service.address

    sync = RouterSync(registry, locate, key=ClusterKey.generate(), retry_s=0.05)

    async def scenario() -> None:
        task = asyncio.create_task(sync.run())
        await asyncio.sleep(1.0)
        task.cancel()

    asyncio.run(scenario())
    controller.service.close()
    assert not registry.workers and not controller.membership.snapshot()


@pytest.mark.parametrize("sender", [None, ClusterKey.generate()], ids=["cluster_key", "worker_sender_key"])
def test_a_forged_report_from_a_member_that_is_not_the_router_is_never_taken(sender):
    """A worker holds the cluster key: a report it forged saying every worker is dead (which the controller
    would act on by killing them) is refused at the handshake, and the controller never reads it."""
    key = ClusterKey.generate()
    controller = Controller(key, [FakeWorker("decode-0", "decode")])
    before = refusals()
    forger = control_socket(zmq.Context.instance(), zmq.DEALER)
    connect_secured(forger, controller.service.address, key=key, sender=sender)
    dead = MemberView("decode-0", "", alive=False, draining=False, in_flight=0)
    send_unless_refused(forger, encode(ControlCall(1, "sync", MembershipReport(-1, (dead,)))))
    assert forger.poll(1000, zmq.POLLIN) == 0  # never answered
    wait_refused(refusals, before, "membership", reasons=("unauthenticated",))
    assert controller.membership.snapshot() == {}  # no report was taken: nothing says decode-0 is dead
    close_all([forger])
    controller.service.close()
