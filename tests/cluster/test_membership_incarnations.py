"""A worker's incarnation is its rank 0's actor id: a restarted controller that adopts the workers
leaves the router's registry as it is (no worker unregistered, no request migrated), while a worker
restarted under its name is replaced there. The real `Membership`, `RouterSync.apply` and `WorkerRegistry`."""

from __future__ import annotations

from cluster.actor_names import follower_name, group_name, parse_rank0, rank0_name
from cluster.membership import Membership
from cluster.router_sync import RouterSync
from router.policy import make_policy
from router.registry import WorkerRegistry
from tests.cluster.fakes import FakeWorker


def _sync(membership: Membership, router: RouterSync) -> None:
    router.apply(membership.sync(router.report()))


def _rebuilt(worker: FakeWorker) -> FakeWorker:
    """The same worker as a restarted controller rebuilds it from its actors (a new object)."""
    return FakeWorker(worker.name, worker.role, worker.restarts, actor_id=worker.actor_id)


def test_a_restarted_controller_adopting_the_workers_changes_nothing_in_the_router():
    registry = WorkerRegistry(make_policy("round_robin"))
    router = RouterSync(registry)
    workers = [FakeWorker("prefill-0", "prefill"), FakeWorker("decode-0", "decode")]
    first = Membership(poll_s=0.01)
    first.adopt(workers)
    _sync(first, router)
    held = dict(registry.workers)
    assert sorted(held) == ["decode-0", "prefill-0"]

    restarted = Membership(poll_s=0.01)  # the controller actor's new incarnation
    restarted.adopt([_rebuilt(w) for w in workers])
    _sync(restarted, router)
    assert all(registry.workers[name] is state and state.alive for name, state in held.items())


def test_a_worker_restarted_under_its_name_is_replaced_in_the_router():
    registry = WorkerRegistry(make_policy("round_robin"))
    router = RouterSync(registry)
    old = FakeWorker("decode-0", "decode")
    membership = Membership(poll_s=0.01)
    membership.adopt([old])
    _sync(membership, router)
    before = registry.workers["decode-0"]
    membership.adopt([FakeWorker("decode-0", "decode", restarts=1)])  # a new actor: a new incarnation
    _sync(membership, router)
    assert registry.workers["decode-0"] is not before and not before.alive  # what it held failed or migrated


def test_actor_names_carry_the_worker_and_its_restarts():
    assert parse_rank0(rank0_name("decode-12", 3)) == ("decode-12", "decode", 3)
    assert parse_rank0(follower_name("prefill-0", 1, 1)) is None  # followers are found through their rank 0
    assert group_name("tandem-ab", "prefill-0", 1) == "tandem-ab/prefill-0@1"
    assert parse_rank0("router") is None
