"""What runs where: the status `/admin/status` returns and `tandem status` prints."""

from __future__ import annotations


def cluster_status(controller) -> dict:
    """Pools (target size, TP, each worker's node, router view and load), Ray nodes, recent controller events."""
    states = controller.router.snapshot()
    spec, workers = controller.members()
    pools = {}
    for role in ("prefill", "decode"):
        pool = spec.pool(role)
        members = [_worker(w, states.get(w.name)) for w in workers if w.role == role]
        pools[role] = {"replicas": pool.replicas, "tensor_parallel_size": pool.tensor_parallel_size,
                       "resources": dict(pool.resources), "node_labels": dict(pool.node_labels),
                       "workers": members}  # fmt: skip
    return {"pools": pools, "nodes": _nodes(), "events": controller.events[-10:]}


def _worker(worker, view) -> dict:
    """`view`: the router's `MemberView` of it (None: not reported yet)."""
    out = {"name": worker.name, "node_id": worker.node_id, "alive": view is not None and view.alive,
           "draining": view is not None and view.draining, "in_flight": view.in_flight if view is not None else 0,
           "restarts": worker.restarts}  # fmt: skip
    load = view.load if view is not None else None
    if load is not None:
        out.update(waiting=load.waiting, running=load.running, free_blocks=load.free_blocks,
                   total_blocks=load.total_blocks, prefix_cache_hit_rate=load.prefix_cache_hit_rate)  # fmt: skip
    return out


def _nodes() -> list[dict]:
    import ray

    return [
        {"node_id": n["NodeID"], "address": n["NodeManagerAddress"], "alive": n["Alive"],
         "resources": {k: v for k, v in n["Resources"].items() if not k.startswith("node:")},
         "labels": {k: v for k, v in n.get("Labels", {}).items() if not k.startswith("ray.io/")}}  # fmt: skip
        for n in ray.nodes()
    ]


def render_status(status: dict) -> str:
    """A terminal table of the status dict."""
    lines = []
    address = {n["node_id"]: n["address"] for n in status["nodes"]}
    for role, pool in status["pools"].items():
        lines.append(f"{role}: {len(pool['workers'])}/{pool['replicas']} workers, TP {pool['tensor_parallel_size']}"
                     + (f", resources {pool['resources']}" if pool["resources"] else "")
                     + (f", labels {pool['node_labels']}" if pool["node_labels"] else ""))  # fmt: skip
        for w in pool["workers"]:
            state = "draining" if w["draining"] else "alive" if w["alive"] else "dead"
            load = (f"running {w['running']} waiting {w['waiting']} free blocks {w['free_blocks']}/{w['total_blocks']}"
                    if "running" in w else "no load yet")  # fmt: skip
            node = f"{w['node_id'][:12]} ({address.get(w['node_id'], '?')})"
            lines.append(f"  {w['name']:<12} {state:<8} node {node}  {load}  restarts {w['restarts']}")
    lines.append("nodes:")
    for n in status["nodes"]:
        lines.append(f"  {n['node_id'][:12]} {n['address']} {'alive' if n['alive'] else 'dead'} {n['resources']}"
                     + (f" labels {n['labels']}" if n["labels"] else ""))  # fmt: skip
    if status["events"]:
        lines.append("recent events:")
        lines.extend(f"  {e}" for e in status["events"])
    return "\n".join(lines)
