"""What a deployment left running in Ray: its workers are detached, so only its stop (or the reaper) ends them."""

from __future__ import annotations


def left_behind(namespace: str) -> list[str]:
    """Names of the actors and placement groups of the deployment's namespace that Ray still holds."""
    import ray

    actors = [a["name"] for a in ray.util.list_named_actors(all_namespaces=True) if a["namespace"] == namespace]
    groups = [g["name"] for g in ray.util.placement_group_table().values()
              if g["name"].startswith(f"{namespace}/") and g["state"] != "REMOVED"]  # fmt: skip
    return actors + groups
