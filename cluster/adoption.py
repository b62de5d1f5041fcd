"""A restarted controller finds its workers again: the named, detached actors of its deployment's namespace.

Each rank 0 named "<worker>@<restarts>" (`cluster.actor_names`) becomes a
`PoolWorker` again, with its tensor-parallel followers and placement group
found by their names. A worker whose rank 0 tells where it is (node, actor id,
control address) within the timeout is adopted as it is: not restarted, and
nothing it holds is lost (its actor id, the incarnation the router knows it by,
is the same). The others are returned as broken, with why: still being built
when the old controller died, or a rank missing. The controller replaces them
under their names.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from cluster.actor_names import follower_name, group_name, parse_rank0
from cluster.spec import ClusterSpec
from cluster.workers import PoolWorker
from runtime.ray_group import TPActors


@dataclass
class Found:
    serving: list[PoolWorker] = field(default_factory=list)
    broken: list[tuple[PoolWorker, str]] = field(default_factory=list)  # (worker, why it cannot be adopted)


def find_workers(spec: ClusterSpec, namespace: str, timeout_s: float) -> Found:
    """Every worker named in `namespace`, each one serving or broken."""
    import ray

    names = {a["name"] for a in ray.util.list_named_actors(all_namespaces=True) if a["namespace"] == namespace}
    workers = [_rebuild(spec, namespace, name, names) for name in sorted(names) if parse_rank0(name)]
    found = Found()
    if not workers:
        return found
    with ThreadPoolExecutor(len(workers)) as pool:  # a rank 0 that does not answer must not hold up the others
        results = list(pool.map(lambda w: _check(w, timeout_s), [w for w, _ in workers]))
    for (worker, missing), error in zip(workers, results):
        why = missing or error
        if why:
            found.broken.append((worker, why))
        else:
            found.serving.append(worker)
    return found


def _rebuild(spec: ClusterSpec, namespace: str, actor_name: str, names: set[str]) -> tuple[PoolWorker, str]:
    """The PoolWorker of a rank 0's name, and what is missing of it ("" if nothing)."""
    import ray

    worker, role, restarts = parse_rank0(actor_name)
    rank0 = ray.get_actor(actor_name, namespace=namespace)
    tp_size = spec.pool(role).tensor_parallel_size
    if tp_size == 1:
        return PoolWorker(worker, role, rank0, restarts=restarts), ""
    wanted = [follower_name(worker, restarts, rank) for rank in range(1, tp_size)]
    followers = [ray.get_actor(name, namespace=namespace) for name in wanted if name in names]
    try:
        group = ray.util.get_placement_group(group_name(namespace, worker, restarts))
    except ValueError:
        group = None
    tp = TPActors(rank0, followers, group)
    missing = [name for name in wanted if name not in names] + ([] if group is not None else ["its placement group"])
    return PoolWorker(worker, role, rank0, tp, restarts=restarts), f"missing {', '.join(missing)}" if missing else ""


def _check(worker: PoolWorker, timeout_s: float) -> str:
    try:
        worker.learn_whereabouts(timeout_s)
    except Exception as err:
        return f"rank 0 does not say where it serves ({type(err).__name__})"
    return ""
