"""Starting a tensor-parallel worker as n Ray actors: one placement group, rank 0 first among equals.

    1. a STRICT_PACK placement group of n bundles: the ranks share one node (gloo/NCCL over loopback)
    2. n actors, cheap constructors (nothing joins anything yet)
    3. rank 0 gives a free loopback "host:port" for the rendezvous (STRICT_PACK: one node)
    4. every rank's `start(init_addr)` at once: each blocks until all have joined
    5. rank 0's `attach_followers(endpoints)`: the followers' I/O workers, as they answered `start`

Shutdown is rank 0 first (its engine tells the followers' forward loops to
stop), then the followers. Ray is imported only here and only when called.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass

# A bundle must hold something; actors ask for num_cpus=0, so this only pins them together.
BUNDLE = {"CPU": 0.01}


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


def start_tp_actors(rank0_cls, follower_cls, engine_args, config, torch_threads: int | None = 1,
                    timeout_s: float = 300.0, bundle: dict | None = None, label_selector: dict | None = None,
                    **options) -> TPActors:  # fmt: skip
    """engine_args.tensor_parallel_size actors as in the module doc; `options` go to rank 0's `.options()`.

    Rank 0 is `rank0_cls(engine_args, config, torch_threads, False)` (False: start later),
    rank r > 0 is `follower_cls(engine_args, config, torch_threads, r)`; every actor asks num_cpus=0.
    `bundle`: resources each rank's bundle adds (e.g. {"GPU": 1}); `label_selector`: labels the node must carry."""
    import ray
    from ray.util.placement_group import placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    tp_size = engine_args.tensor_parallel_size
    selectors = [dict(label_selector)] * tp_size if label_selector else None
    group = placement_group([{**BUNDLE, **(bundle or {})}] * tp_size, strategy="STRICT_PACK",
                            bundle_label_selector=selectors)  # fmt: skip
    try:
        ray.get(group.ready(), timeout=timeout_s)
    except BaseException:  # no node fits (yet): do not leave a pending group behind
        from ray.util.placement_group import remove_placement_group

        remove_placement_group(group)
        raise
    gpus = (bundle or {}).get("GPU", 0)  # a rank asks its bundle's GPUs, so Ray makes them visible to it
    actors = []
    for rank in range(tp_size):
        placement = {"scheduling_strategy": PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=rank)}
        if rank == 0:
            opts = {"num_cpus": 0, "num_gpus": gpus, **options, **placement}
            actors.append(ray.remote(rank0_cls).options(**opts).remote(engine_args, config, torch_threads, False))
        else:
            inherited = {k: options[k] for k in ("runtime_env",) if k in options}  # e.g. the cluster key
            follower = ray.remote(follower_cls).options(num_cpus=0, num_gpus=gpus, **inherited, **placement)
            actors.append(follower.remote(engine_args, config, torch_threads, rank))
    tp = TPActors(actors[0], actors[1:], group)
    try:
        init_addr = ray.get(actors[0].free_init_addr.remote(), timeout=timeout_s)
        endpoints = ray.get([actor.start.remote(init_addr) for actor in actors], timeout=timeout_s)[1:]
        ray.get(actors[0].attach_followers.remote(endpoints), timeout=timeout_s)
    except BaseException:
        tp.kill()
        raise
    return tp
