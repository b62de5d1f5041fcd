"""The routing seam: `RoutingPolicy.pick(tokens, workers, cache_salt) -> worker`, and the policies by name.

A policy chooses among the live workers of one pool for a prompt's token ids.
It may keep its own state (a prefix tree, a cursor), updated in `pick` as the
dispatch happens; the caller counts the dispatch in `WorkerState.in_flight`.
`forget(name)` drops whatever a policy remembers of a worker that died or left.
"""

from __future__ import annotations

from typing import Callable, Protocol, Sequence

from router.policies.cache_aware import CacheAware, CacheAwareConfig
from router.policies.decode_choice import DecodeByKVRoom, PromptPolicyWithRoom
from router.policies.least_loaded import LeastLoaded
from router.policies.round_robin import RoundRobin
from router.worker_state import WorkerState

__all__ = ["POLICIES", "CacheAware", "CacheAwareConfig", "DecodeByKVRoom", "LeastLoaded", "RoundRobin",
           "RoutingPolicy", "make_decode_policy", "make_policy", "make_pool_policies"]


class RoutingPolicy(Protocol):
    def pick(self, tokens: Sequence[int], workers: Sequence[WorkerState],
             cache_salt: str | None = None) -> WorkerState:  # fmt: skip
        """One of `workers` (non-empty, all alive) for this prompt; records the choice. `cache_salt`: the
        request's prefix-cache salt (`wire.cache_salt`): its prefix is cached only where that salt sent it."""
        ...

    def forget(self, worker_name: str) -> None: ...


POLICIES: dict[str, Callable[..., RoutingPolicy]] = {
    "cache_aware": CacheAware,  # options: the fields of CacheAwareConfig
    "least_loaded": LeastLoaded,  # options: seed
    "round_robin": RoundRobin,
}


def make_policy(name: str, **options) -> RoutingPolicy:
    if name not in POLICIES:
        raise ValueError(f"unknown routing policy {name!r}: choose one of {', '.join(sorted(POLICIES))}")
    return POLICIES[name](**options)


def make_decode_policy(**options) -> RoutingPolicy:
    """The decode pool's policy (options: block_size, headroom_blocks); see policies/decode_choice.py."""
    return DecodeByKVRoom(**options)


def make_pool_policies(name: str, options: dict, block_size: int,
                       colocated: bool) -> tuple[RoutingPolicy, RoutingPolicy]:
    """The prefill pool's policy (`name` with `options`) and the decode pool's. Colocated, the decode workers
    compute the prompts, so the prompt's policy chooses them too, among those with KV room for the prompt:
    prefix affinity saves their prefill (two colocated workers sharing 8 prefixes over 40 prompts: 16 of
    the 40 were cache misses when chosen by KV room alone, 8 are unavoidable). Otherwise a prompt's KV
    arrives whole from prefill: decode by KV room."""
    room = DecodeByKVRoom(block_size=block_size)
    decode = PromptPolicyWithRoom(make_policy(name, **options), room) if colocated else room
    return make_policy(name, **options), decode
