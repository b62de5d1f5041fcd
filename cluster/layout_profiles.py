"""From a cluster spec (what `tandem serve` takes) to the planner's `Layout`: each pool's profile, the engine
and router knobs the simulation honours.

A pool's profile comes from a file (`--profile` for every pool, `--prefill-profile` / `--decode-profile`
each its own: a pool of another device type), or is the measured profile of this machine for the
pool's dtype and threads (`planner.local_profile`, measured first if none is cached).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable

from cluster.spec import ClusterSpec, PoolSpec
from costmodel import Profile
from planner.layout import EngineLimits, Layout, PoolLayout, RouterKnobs


@dataclass(frozen=True)
class ProfileFiles:
    every_pool: str | None = None
    prefill: str | None = None
    decode: str | None = None

    def for_role(self, role: str) -> str | None:
        return (self.prefill if role == "prefill" else self.decode) or self.every_pool


def engine_limits(spec: ClusterSpec) -> EngineLimits:
    e = spec.engine
    return EngineLimits(e.max_num_seqs, e.max_num_batched_tokens, e.max_model_len, e.block_size,
                        e.enable_prefix_caching, e.kv_cache_memory, e.num_kv_blocks, e.quantization)  # fmt: skip


def router_knobs(spec: ClusterSpec) -> RouterKnobs:
    r = spec.router
    return RouterKnobs(r.routing_policy, r.max_in_flight, r.max_predicted_ttft_s)


def layout_of(spec: ClusterSpec, files: ProfileFiles = ProfileFiles(), refresh: bool = False,
              on_progress: Callable[[str], None] = lambda what: None) -> Layout:  # fmt: skip
    """The spec's layout with a profile for each non-empty pool (raises ValueError when one cannot be had)."""
    pools = {}
    for role in ("prefill", "decode"):
        pool = spec.pool(role)
        profile = pool_profile(spec, role, files, refresh, on_progress) if pool.replicas else None
        pools[role] = PoolLayout(pool.replicas, profile)
    return Layout(pools["prefill"], pools["decode"], engine_limits(spec), router_knobs(spec))


def pool_profile(spec: ClusterSpec, role: str, files: ProfileFiles, refresh: bool = False,
                 on_progress: Callable[[str], None] = lambda what: None) -> Profile:  # fmt: skip
    pool: PoolSpec = spec.pool(role)
    path = files.for_role(role)
    if path is not None:
        profile = Profile.load(path)
        if profile.tp_size != pool.tensor_parallel_size:
            raise ValueError(f"{role}.tensor_parallel_size is {pool.tensor_parallel_size} but the profile {path} is "
                             f"of tp {profile.tp_size}")  # fmt: skip
        return profile
    if pool.tensor_parallel_size != 1:
        raise ValueError(f"{role}.tensor_parallel_size {pool.tensor_parallel_size}: this machine's profiles are "
                         "measured at tp 1; give the pool a profile file (--profile, --{role}-profile)")  # fmt: skip
    from planner.local_profile import LocalWorker, local_profile

    threads = pool.torch_threads or os.cpu_count() or 1
    worker = LocalWorker(spec.model, pool.dtype, threads, engine_limits(spec))
    return local_profile(worker, refresh, on_progress=on_progress)
