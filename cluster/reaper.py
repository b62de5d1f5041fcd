"""Nothing of a deployment left behind: kill every worker actor and placement group named in its namespace.

The controller stops the workers it knows (`Controller.shutdown`); this sweeps
up what it could not: workers launched while it died, or all of them when it is
dead for good. Detached actors never die on their own, so `Deployment.stop`
always runs it last. Ownership: the deployment's, once its controller is done.
"""

from __future__ import annotations

import logging

from cluster import ledger
from cluster.actor_names import CONTROLLER

logger = logging.getLogger("tandem.cluster")


def reap(namespace: str, keep: str | None = None) -> int:
    """Kill what is left in `namespace` (actors but `keep`, placement groups, the ledger); returns how many workers."""
    import ray
    from ray.util.placement_group import PlacementGroup, PlacementGroupID, remove_placement_group

    names = [a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
             if a["namespace"] == namespace and a["name"] != keep]  # fmt: skip
    for name in names:
        try:
            ray.kill(ray.get_actor(name, namespace=namespace), no_restart=True)
        except ValueError:
            pass  # gone meanwhile
    for group_id, group in ray.util.placement_group_table().items():
        if group.get("name", "").startswith(f"{namespace}/") and group.get("state") != "REMOVED":
            remove_placement_group(PlacementGroup(PlacementGroupID.from_hex(group_id)))
    ledger.forget(namespace)
    workers = [name for name in names if name != CONTROLLER]
    if workers:
        logger.warning("killed %d worker actors the controller left behind: %s", len(workers), ", ".join(workers))
    return len(workers)
