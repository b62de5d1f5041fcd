"""Where a deployment's worker actors are found again: Ray names in the deployment's own namespace.

    namespace        "tandem-<id>"                     one per `Deployment` (`new_namespace`)
    controller       "controller"                      the controller actor, detached too
    rank 0           "<worker>@<restarts>"             e.g. "decode-0@2": decode-0, restarted twice
    rank r > 0       "<worker>@<restarts>/rank<r>"     its tensor-parallel followers
    placement group  "<namespace>/<worker>@<restarts>" (PG names live in the job's namespace)

Worker actors and their placement groups are detached, so they outlive the
controller actor that launched them (Ray would kill an actor's children with
it): a restarted controller finds them by these names (`cluster.adoption`), and
whoever ends the deployment kills them by the same names (`cluster.reaper`).
The restart count in the name keeps a replacement's name free of its
predecessor's, whose name Ray may not have released yet.
"""

from __future__ import annotations

import re
import uuid

CONTROLLER = "controller"
_RANK0 = re.compile(r"^(?P<worker>(?P<role>prefill|decode)-\d+)@(?P<restarts>\d+)$")


def new_namespace() -> str:
    return f"tandem-{uuid.uuid4().hex[:12]}"


def rank0_name(worker: str, restarts: int) -> str:
    return f"{worker}@{restarts}"


def follower_name(worker: str, restarts: int, rank: int) -> str:
    return f"{rank0_name(worker, restarts)}/rank{rank}"


def group_name(namespace: str, worker: str, restarts: int) -> str:
    return f"{namespace}/{rank0_name(worker, restarts)}"


def parse_rank0(actor_name: str) -> tuple[str, str, int] | None:
    """(worker name, role, restarts) of a rank 0's actor name; None for any other name (a follower's)."""
    match = _RANK0.match(actor_name)
    if match is None:
        return None
    return match["worker"], match["role"], int(match["restarts"])


def detached(namespace: str | None, name: str) -> dict:
    """Ray `.options()` naming an actor in `namespace` and detaching it from its creator;
    {} without a namespace (the actor then dies with whoever created it)."""
    if namespace is None:
        return {}
    return {"name": name, "namespace": namespace, "lifetime": "detached"}
