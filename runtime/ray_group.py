"""Starting a tensor-parallel worker as n Ray actors: one placement group, rank 0 first among equals.

    1. a STRICT_PACK placement group of n bundles: the ranks share one node (gloo/NCCL over loopback)
    2. n actors of the role's one actor class, rank r given as an argument (cheap: nothing joins yet)
    3. rank 0 gives a free loopback "host:port" for the rendezvous (STRICT_PACK: one node)
    4. every rank's `start(init_addr)` at once: each blocks until all have joined
    5. rank 0's `attach_followers(endpoints)`: the followers' I/O workers, as they answered `start`

Named (a controller's workers, `cluster.actor_names`): every rank and the group
are named and detached, so they outlive the controller that started them and a
restarted one finds them again; unnamed (tests), they die with their creator.
Shutdown is rank 0 first (its engine tells the followers' forward loops to
stop), then the followers. Ray is imported only here and only when called.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass
from typing import Callable

# A bundle must hold something; actors ask for num_cpus=0, so this only pins them together.
BUNDLE = {"CPU": 0.01}
# Options every worker actor needs: a thread for heartbeats beside a long start or shutdown (`runtime.actor`).
ACTOR_OPTIONS = {"max_concurrency": 8}


def start_worker_actor(actor_cls, engine_args, config, torch_threads: int | None = 1, **options):
    """A TP=1 worker of `actor_cls`'s role (`runtime.actor.WorkerActor`) as a Ray actor handle (Ray must be
    initialised), asking num_cpus=0; `options` go to `.options()` (resources, name...). TP=n: `start_tp_actors`."""
    import ray

    options = {"num_cpus": 0, **ACTOR_OPTIONS, **options}
    return ray.remote(actor_cls).options(**options).remote(engine_args, config, torch_threads)


def free_init_addr() -> str:
    """A free loopback "host:port" on this node (run inside rank 0's actor): the ranks share its node."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{sock.getsockname()[1]}"


@dataclass
class TPActors:
    """Handles of one tensor-parallel worker's ranks; `rank0` is the worker's public face."""

    rank0: object
    followers: list
    placement_group: object

    def shutdown(self, timeout_s: float = 60.0) -> list[bool]:
        """Rank 0's `shutdown()` (pool all free?) then each follower's (loop ended, nothing held?)."""
        import ray

        first = ray.get(self.rank0.shutdown.remote(), timeout=timeout_s)
        return [first, *ray.get([f.shutdown.remote() for f in self.followers], timeout=timeout_s)]

    def kill(self) -> None:
        import ray
        from ray.util.placement_group import remove_placement_group

        for actor in (self.rank0, *self.followers):
            ray.kill(actor, no_restart=True)
        remove_placement_group(self.placement_group)


@dataclass(frozen=True)
class TPNames:
    """Ray `.options()` naming rank r (`rank_options(r)`), and the group's name; detached when named."""

    rank_options: Callable[[int], dict]
    group: str


def start_tp_actors(actor_cls, engine_args, config, torch_threads: int | None = 1, timeout_s: float = 300.0,
                    bundle: dict | None = None, label_selector: dict | None = None, names: TPNames | None = None,
                    **options) -> TPActors:  # fmt: skip
    """engine_args.tensor_parallel_size actors as in the module doc; rank r is
    `actor_cls(engine_args, config, torch_threads, r)`, asking num_cpus=0; `options` go to every rank.
    `bundle`: resources each rank's bundle adds (e.g. {"GPU": 1}); `label_selector`: labels the node must carry."""
    group = _ready_group(engine_args.tensor_parallel_size, bundle, label_selector, timeout_s, names)
    actors = _rank_actors(actor_cls, engine_args, config, torch_threads, group, bundle, options, names)
    tp = TPActors(actors[0], actors[1:], group)
    try:
        _rendezvous(actors, timeout_s)
    except BaseException:
        tp.kill()
        raise
    return tp


def _ready_group(tp_size: int, bundle: dict | None, label_selector: dict | None, timeout_s: float,
                 names: TPNames | None):  # fmt: skip
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group

    selectors = [dict(label_selector)] * tp_size if label_selector else None
    named = {"name": names.group, "lifetime": "detached"} if names is not None else {}
    group = placement_group([{**BUNDLE, **(bundle or {})}] * tp_size, strategy="STRICT_PACK",
                            bundle_label_selector=selectors, **named)  # fmt: skip
    try:
        ray.get(group.ready(), timeout=timeout_s)
    except BaseException:  # no node fits (yet): leave no pending group behind
        remove_placement_group(group)
        raise
    return group


def _rank_actors(actor_cls, engine_args, config, torch_threads, group, bundle, options, names) -> list:
    import ray
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    gpus = (bundle or {}).get("GPU", 0)  # a rank asks its bundle's GPUs, so Ray makes them visible to it
    actors = []
    for rank in range(engine_args.tensor_parallel_size):
        placement = PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=rank)
        named = names.rank_options(rank) if names is not None else {}
        opts = {"num_cpus": 0, "num_gpus": gpus, **ACTOR_OPTIONS, **options, "scheduling_strategy": placement, **named}
        actors.append(ray.remote(actor_cls).options(**opts).remote(engine_args, config, torch_threads, rank))
    return actors


def _rendezvous(actors: list, timeout_s: float) -> None:
    import ray

    init_addr, leader_key = ray.get([actors[0].free_init_addr.remote(), actors[0].sender_key.remote()], timeout=timeout_s)
    endpoints = ray.get([actor.start.remote(init_addr, leader_key) for actor in actors], timeout=timeout_s)[1:]
    ray.get(actors[0].attach_followers.remote(endpoints), timeout=timeout_s)
