"""A tensor-parallel worker whose ranks and placement group outlive the controller actor that starts it.

The same start as `runtime.ray_group.start_tp_actors` (one STRICT_PACK
group, n actors, rank 0's rendezvous address, every rank's `start` at once,
then `attach_followers`), with every rank named in the deployment's namespace
and detached, and the placement group named and detached too (`cluster.actor_names`):
`start_tp_actors` names rank 0 only and leaves the followers and the group
owned by their creator, so they would die with the controller. Without a
namespace it is `start_tp_actors` itself.
"""

from __future__ import annotations

from cluster.actor_names import detached, follower_name, group_name, rank0_name
from runtime.ray_group import BUNDLE, TPActors, start_tp_actors


def start_named_tp(rank0_cls, follower_cls, engine_args, config, torch_threads, timeout_s: float,
                   namespace: str | None, worker: str, restarts: int, bundle: dict | None = None,
                   label_selector: dict | None = None, **options) -> TPActors:  # fmt: skip
    """`start_tp_actors(...)` with every rank named (see the module doc); `options` go to every rank."""
    if namespace is None:
        return start_tp_actors(rank0_cls, follower_cls, engine_args, config, torch_threads, timeout_s,
                               bundle=bundle, label_selector=label_selector, **options)  # fmt: skip
    group = _ready_group(engine_args.tensor_parallel_size, bundle, label_selector, timeout_s,
                         group_name(namespace, worker, restarts))  # fmt: skip
    actors = _rank_actors(rank0_cls, follower_cls, engine_args, config, torch_threads, group, bundle, options,
                          lambda rank: follower_name(worker, restarts, rank) if rank else rank0_name(worker, restarts),
                          namespace)  # fmt: skip
    tp = TPActors(actors[0], actors[1:], group)
    try:
        _rendezvous(actors, timeout_s)
    except BaseException:
        tp.kill()
        raise
    return tp


def _ready_group(tp_size: int, bundle: dict | None, label_selector: dict | None, timeout_s: float, name: str):
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group

    selectors = [dict(label_selector)] * tp_size if label_selector else None
    group = placement_group([{**BUNDLE, **(bundle or {})}] * tp_size, strategy="STRICT_PACK", name=name,
                            lifetime="detached", bundle_label_selector=selectors)  # fmt: skip
    try:
        ray.get(group.ready(), timeout=timeout_s)
    except BaseException:  # no node fits (yet): leave no pending group behind
        remove_placement_group(group)
        raise
    return group


def _rank_actors(rank0_cls, follower_cls, engine_args, config, torch_threads, group, bundle, options, name_of,
                 namespace) -> list:  # fmt: skip
    import ray
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    gpus = (bundle or {}).get("GPU", 0)  # a rank asks its bundle's GPUs, so Ray makes them visible to it
    actors = []
    for rank in range(engine_args.tensor_parallel_size):
        placement = PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=rank)
        opts = {"num_cpus": 0, "num_gpus": gpus, **options, "scheduling_strategy": placement,
                **detached(namespace, name_of(rank))}  # fmt: skip
        if rank == 0:
            actors.append(ray.remote(rank0_cls).options(**opts).remote(engine_args, config, torch_threads, False))
        else:
            actors.append(ray.remote(follower_cls).options(**opts).remote(engine_args, config, torch_threads, rank))
    return actors


def _rendezvous(actors: list, timeout_s: float) -> None:
    import ray

    init_addr = ray.get(actors[0].free_init_addr.remote(), timeout=timeout_s)
    endpoints = ray.get([actor.start.remote(init_addr) for actor in actors], timeout=timeout_s)[1:]
    ray.get(actors[0].attach_followers.remote(endpoints), timeout=timeout_s)
