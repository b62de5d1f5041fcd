"""Each deployment gets its own cluster key unless its spec fixes one; the key reaches workers in their config."""

from __future__ import annotations

import pytest

from cluster.deployment import with_cluster_key
from cluster.spec import ClusterSpec, SpecError, parse_spec
from cluster.workers import worker_config
from wire.socket_security import ClusterKey, sender_keypair


def test_a_spec_without_a_key_gets_a_new_one_each_time_and_a_fixed_one_is_kept():
    first, second = with_cluster_key(ClusterSpec()), with_cluster_key(ClusterSpec())
    assert first.cluster_key and second.cluster_key and first.cluster_key != second.cluster_key
    assert with_cluster_key(first).cluster_key == first.cluster_key
    assert first.cluster_key[41:] not in repr(first)  # the secret is never printed with the spec


def test_a_malformed_key_in_a_spec_is_refused():
    with pytest.raises((SpecError, ValueError), match="cluster key"):
        parse_spec({"cluster_key": "not-a-key"})


def test_each_worker_config_carries_the_key_and_never_prints_it():
    spec = with_cluster_key(ClusterSpec())
    configs = [worker_config(spec, role, f"{role}-0") for role in ("prefill", "decode")]
    assert all(c.cluster_key == spec.cluster_key and spec.cluster_key[41:] not in repr(c) for c in configs)


def test_the_router_key_is_the_serving_process_own_and_workers_get_only_its_public_half():
    spec = with_cluster_key(ClusterSpec(router_key=ClusterKey.generate().public))  # a spec's own is replaced
    assert spec.router_key == sender_keypair().public
    configs = [worker_config(spec, role, f"{role}-0") for role in ("prefill", "decode")]
    assert all(c.router_key == spec.router_key for c in configs)
    assert sender_keypair().secret not in repr(spec) + "".join(map(repr, configs))
