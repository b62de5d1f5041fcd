"""The cores of one machine handed to the worker ranks that run on it: one set per rank, none shared.

When separate pools share a machine, a prefill step must not slow a decode step through the CPU, so each
rank gets cores of its own (`runtime.cpu_pinning`), `torch_threads` of them. Decode ranks take cores from
the top down, prefill ranks from the bottom up above what is left over; the leftover (the machine's cores
beyond what the ranks ask) are the lowest, kept for the serve process (the router) and the controller.
With no core left over, those two go on the prefill ranks' cores, where a stall costs least: a decode
step's stall shows in every stream it serves (`core_map_for`). Ray's daemons, started before the
layout is known, stay on every core.

A worker keeps its cores across restarts (by name) and gives them back when it is removed. A worker
whose ranks do not fit in the free cores runs unpinned (`claim` answers ()), sharing the machine as
workers did before the map. Only a deployment on one machine without GPUs gets a map (`cpu_pinning`).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class CoreMap:
    cores: tuple[int, ...]  # the machine's, ascending
    reserve: int = 0  # the lowest cores, left to the serve process and the controller
    serve: tuple[int, ...] = ()  # where the serve process and the controller run (`core_map_for`)
    held: dict[str, tuple[tuple[int, ...], ...]] = field(default_factory=dict)  # worker -> a set per rank

    def claim(self, name: str, role: str, ranks: int, threads: int) -> tuple[tuple[int, ...], ...]:
        """`name`'s core set per rank (the same across its restarts); () when they do not fit."""
        if name in self.held:
            return self.held[name]
        if threads < 1:  # torch's default threads: as many as cores, so no set of its own
            return ()
        taken = {core for sets in self.held.values() for cores in sets for core in cores}
        free = [core for core in self.cores[self.reserve :] if core not in taken]
        if ranks * threads > len(free):
            return ()
        picked = free[-ranks * threads :] if role == "decode" else free[: ranks * threads]
        self.held[name] = tuple(tuple(picked[r * threads : (r + 1) * threads]) for r in range(ranks))
        return self.held[name]

    def release(self, name: str) -> None:
        self.held.pop(name, None)

    def describe(self) -> str:
        """One line: each worker's cores by rank, and what is left to the serve process."""
        workers = [f"{name} {'/'.join(','.join(map(str, s)) for s in sets)}" for name, sets in sorted(self.held.items())]
        rest = ",".join(map(str, self.cores[: self.reserve])) or "none"
        return f"cores: {'; '.join(workers) or 'no worker pinned'}; serve process and Ray: {rest}"


def core_map_for(spec, machines, cores: tuple[int, ...]) -> CoreMap | None:
    """The map of a deployment on this one machine (`cores`: its) without GPUs; None: several machines,
    GPUs, pinning off, or a pool of torch's default threads.

    The serve process (the router) and the controller go on the leftover cores, else on the prefill ranks'
    (the lowest above the leftover), else on every core (colocated: nothing to keep them off)."""
    pools = [spec.pool(role) for role in ("prefill", "decode") if spec.pool(role).replicas]
    if machines.nodes > 1 or machines.gpus or not spec.cpu_pinning:
        return None
    if any(p.torch_threads is None or p.num_gpus for p in pools):
        return None
    cores = tuple(sorted(cores))
    wanted = {role: spec.pool(role).replicas * spec.pool(role).tensor_parallel_size * spec.pool(role).torch_threads
              for role in ("prefill", "decode")}  # fmt: skip
    reserve = max(0, len(cores) - sum(wanted.values()))
    serve = cores[:reserve] or cores[: wanted["prefill"]] or cores
    return CoreMap(cores, reserve, serve)
