"""The default layout of `tandem serve`: which pools, how many workers, how many threads, chosen for the
machines at hand, with the reason printed.

    spec, why = choose_layout(spec, Machines.of_ray_cluster())

A spec (file or flags) that names any layout field of a pool (`LAYOUT_FIELDS`) keeps its pools as they
are: the layout is the operator's. Otherwise:
  - GPUs, or several nodes: the separate pools the spec defaults to (1 prefill + 1 decode worker), which
    scale apart (`tandem scale`, the autoscaler);
  - one machine with CPUs only: one worker that prefills and decodes (colocated mode, no prefill pool)
    on every core of the machine. With separate pools on few cores, each phase idles its worker's cores
    while the other has work: measured on 2 cores, one colocated worker on both cores served 1.5x the
    output tokens of 1 prefill + 1 decode worker on one core each (benchmarks/history/2026-11-22-1400-bench_cluster.md). It
    is also the layout of the peer users compare against, vLLM's CPU server: one engine, all cores.
"""

from __future__ import annotations

from dataclasses import dataclass

from cluster.spec import ClusterSpec, with_overrides

# The pool fields that say where and how many workers run; dtype is not one of them.
LAYOUT_FIELDS = frozenset({"replicas", "tensor_parallel_size", "torch_threads", "resources", "node_labels",
                           "num_gpus"})  # fmt: skip


@dataclass(frozen=True)
class Machines:
    """What the Ray cluster has now."""

    nodes: int
    local_cpus: int  # CPUs Ray counts on the node of this process
    gpus: float  # in the whole cluster

    @classmethod
    def this_machine(cls) -> "Machines":
        """This machine alone, read without Ray (what an embedded local Ray would count)."""
        import os

        import torch

        return cls(1, len(os.sched_getaffinity(0)), float(torch.cuda.device_count()))

    @classmethod
    def of_ray_cluster(cls) -> "Machines":
        import ray

        node_id = ray.get_runtime_context().get_node_id()
        alive = [node for node in ray.nodes() if node.get("Alive")]
        here = next((node for node in alive if node["NodeID"] == node_id), {"Resources": {}})
        total_gpus = sum(node["Resources"].get("GPU", 0) for node in alive)
        return cls(len(alive), int(here["Resources"].get("CPU", 1)), total_gpus)


def configured_layout(spec: ClusterSpec) -> bool:
    """Whether the spec (or a flag) set where and how many workers run."""
    return any(LAYOUT_FIELDS & spec.pool(role).model_fields_set for role in ("prefill", "decode"))


def choose_layout(spec: ClusterSpec, machines: Machines) -> tuple[ClusterSpec, str]:
    """The spec to serve with, and why (one line for the operator)."""
    if configured_layout(spec):
        return spec, _pools(spec) + ", as configured"
    if machines.gpus or machines.nodes > 1:
        return spec, _pools(spec) + f", separate pools ({machines.nodes} node(s), {machines.gpus:g} GPU(s))"
    cores = max(1, machines.local_cpus)
    colocated = with_overrides(spec, {"prefill.replicas": 0, "decode.replicas": 1, "decode.torch_threads": cores})
    why = (f"1 worker that prefills and decodes on all {cores} cores (one machine, no GPU: separate prefill "
           f"and decode workers would leave cores idle; --num-prefill 1 disaggregates)")  # fmt: skip
    return colocated, why


def _pools(spec: ClusterSpec) -> str:
    return " + ".join(f"{spec.pool(role).replicas} {role} (tp {spec.pool(role).tensor_parallel_size}, "
                      f"{spec.pool(role).torch_threads or 'default'} thread(s) per rank)"
                      for role in ("prefill", "decode"))  # fmt: skip
