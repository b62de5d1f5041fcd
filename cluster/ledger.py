"""The pools' target sizes, kept in Ray's GCS so that a restarted controller keeps them.

The controller actor's memory dies with it; its workers (detached) and this
record do not. The controller writes it on every scale, a restarted controller
reads it once (`cluster.adoption`), the deployment's end deletes it
(`cluster.reaper`). The store is Ray's internal key-value store in the GCS, the
one Ray's own libraries keep their state in; one key per deployment namespace.
"""

from __future__ import annotations

import json

_KEY = "pool_sizes"
_KV_NAMESPACE_PREFIX = "tandem:"


def save_sizes(namespace: str, sizes: dict[str, int]) -> None:
    from ray.experimental.internal_kv import _internal_kv_put

    _internal_kv_put(_KEY, json.dumps(sizes), overwrite=True, namespace=_KV_NAMESPACE_PREFIX + namespace)


def load_sizes(namespace: str) -> dict[str, int] | None:
    """The sizes last saved for this deployment; None if none were."""
    from ray.experimental.internal_kv import _internal_kv_get

    raw = _internal_kv_get(_KEY, namespace=_KV_NAMESPACE_PREFIX + namespace)
    return None if raw is None else {role: int(n) for role, n in json.loads(raw).items()}


def forget(namespace: str) -> None:
    from ray.experimental.internal_kv import _internal_kv_del

    _internal_kv_del(_KEY, namespace=_KV_NAMESPACE_PREFIX + namespace)
