"""A deployment to simulate: its pools (how many workers, each described by a profile), the engine knobs
they share and the router's; what `tandem serve` would run, as the planner sees it.

`cluster.plan_cli` builds one from a `cluster.spec.ClusterSpec` (the same spec and flags `tandem serve`
takes) and the profiles of the devices each pool runs on.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from costmodel import Profile
from router.handoff import HandoffTimeouts
from router.local_prefill import LocalPrefillRule
from runtime.arrival_window import ArrivalWindowConfig


@dataclass(frozen=True)
class EngineLimits:
    """The engine knobs both pools share (vLLM's names; `cluster.spec.EngineSpec`)."""

    max_num_seqs: int = 256
    max_num_batched_tokens: int = 2048
    max_model_len: int | None = None  # None: the model's context
    block_size: int = 16
    enable_prefix_caching: bool = True
    kv_cache_memory: int | None = None  # bytes per worker; None: what the profile measured (or derived)
    num_kv_blocks: int | None = None
    quantization: str = "auto"  # engine.config.QUANTIZATIONS: file's blocks ("auto", "gguf"), Q8_0 ("int8"), "none"

    def num_blocks(self, profile: Profile) -> int:
        if self.num_kv_blocks is not None:
            return self.num_kv_blocks
        if self.kv_cache_memory is not None:
            return max(1, self.kv_cache_memory // (profile.kv_bytes_per_token * self.block_size))
        return max(1, profile.kv_cache_tokens // self.block_size)


@dataclass(frozen=True)
class RouterKnobs:
    """The router settings that decide where and whether requests run (`router.config.RouterConfig`'s)."""

    routing_policy: str = "cache_aware"
    max_in_flight: int = 256
    max_predicted_ttft_s: float = 60.0
    load_refresh_s: float = 0.5
    local_prefill: LocalPrefillRule = field(default_factory=LocalPrefillRule)
    handoff: HandoffTimeouts = field(default_factory=HandoffTimeouts)


@dataclass(frozen=True)
class PoolLayout:
    replicas: int
    profile: Profile | None  # None only for an empty pool

    def __post_init__(self):
        if self.replicas < 0 or (self.replicas and self.profile is None):
            raise ValueError("a pool needs replicas >= 0 and, when it has any, a profile")


@dataclass(frozen=True)
class Layout:
    prefill: PoolLayout  # replicas 0: colocated, every decode worker prefills its own prompts
    decode: PoolLayout
    engine: EngineLimits = field(default_factory=EngineLimits)
    router: RouterKnobs = field(default_factory=RouterKnobs)
    arrival_window: ArrivalWindowConfig = field(default_factory=ArrivalWindowConfig)

    def __post_init__(self):
        if self.decode.replicas < 1:
            raise ValueError("decode.replicas must be >= 1: decode workers serve every request")
        if self.prefill.replicas and self.prefill.profile.model != self.decode.profile.model:
            raise ValueError("the prefill and decode profiles are of different models")

    @property
    def colocated(self) -> bool:
        return self.prefill.replicas == 0

    @property
    def devices(self) -> int:
        """Devices (GPUs, or CPU workers) the layout occupies: workers times their tensor-parallel size."""
        return sum(pool.replicas * pool.profile.tp_size for pool in (self.prefill, self.decode) if pool.replicas)

    def describe(self) -> str:
        def pool(p: PoolLayout) -> str:
            device = p.profile.device.split(" [")[0]  # a CPU's name without its extensions
            size = f"{p.profile.torch_threads} thread(s)" if p.profile.torch_threads else f"tp{p.profile.tp_size}"
            return f"{p.replicas} x {device} {size}"

        if self.colocated:
            return f"colocated: {pool(self.decode)}"
        return f"{self.prefill.replicas}P+{self.decode.replicas}D: prefill {pool(self.prefill)}, decode {pool(self.decode)}"
