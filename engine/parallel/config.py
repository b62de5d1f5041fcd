"""How an engine is split across tensor-parallel ranks, and whether a model can be split so.

`ParallelConfig` is frozen like every engine config; each rank gets its own with
`dataclasses.replace(cfg, rank=r)`. With tp_size == 1 (the default) the engine
creates no process group and runs exactly the single-process path.
"""

from __future__ import annotations

from dataclasses import dataclass

BACKENDS = ("auto", "gloo", "nccl")


@dataclass(frozen=True)
class ParallelConfig:
    """tp_size processes, this one is `rank`; they meet at `init_addr` ("host:port", rank 0 listens).

    backend "auto" is gloo on CPU and NCCL on CUDA; `timeout_s` bounds how long a rank
    waits for the others (at start-up and in every collective) before it raises.
    """

    tp_size: int = 1
    rank: int = 0
    init_addr: str = "127.0.0.1:29500"
    backend: str = "auto"
    timeout_s: float = 600.0

    def __post_init__(self):
        if self.tp_size < 1:
            raise ValueError(f"tensor_parallel_size must be >= 1, got {self.tp_size}")
        if not 0 <= self.rank < self.tp_size:
            raise ValueError(f"tensor parallel rank must be in [0, {self.tp_size}), got {self.rank}")
        if self.backend not in BACKENDS:
            raise ValueError(f"distributed backend must be one of {', '.join(BACKENDS)}, got {self.backend!r}")
        if self.timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {self.timeout_s}")
        self.host_port()  # validates init_addr

    def host_port(self) -> tuple[str, int]:
        host, sep, port = self.init_addr.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"init_addr must be 'host:port', got {self.init_addr!r}")
        return host, int(port)

    def resolve_backend(self, device: str) -> str:
        if self.backend == "auto":
            return "nccl" if device.startswith("cuda") else "gloo"
        if self.backend == "nccl" and not device.startswith("cuda"):
            raise ValueError(f"the nccl backend needs a CUDA device, got device {device!r}; use gloo")
        return self.backend


def check_tensor_parallel(num_heads: int, num_kv_heads: int, intermediate_size: int, tp_size: int) -> None:
    """Raise ValueError unless heads and the MLP split evenly over tp_size ranks.

    KV heads either split evenly or, when there are fewer than ranks, each is
    replicated on tp_size / num_kv_heads ranks.
    """
    if tp_size == 1:
        return
    if num_heads % tp_size:
        raise ValueError(f"tensor_parallel_size {tp_size} must divide the number of attention heads ({num_heads})")
    if intermediate_size % tp_size:
        raise ValueError(
            f"tensor_parallel_size {tp_size} must divide the MLP intermediate size ({intermediate_size})"
        )
    if num_kv_heads % tp_size and tp_size % num_kv_heads:
        raise ValueError(
            f"tensor_parallel_size {tp_size} and the number of KV heads ({num_kv_heads}) must divide "
            "one another (KV heads are split, or replicated when there are fewer than ranks)"
        )
