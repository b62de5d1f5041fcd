"""Each deployment gets its own cluster key unless its spec fixes one; the key reaches workers' environments."""

from __future__ import annotations

import pytest

from cluster.deployment import with_cluster_key
from cluster.spec import ClusterSpec, SpecError, parse_spec
from wire.socket_security import ENV_VAR, ClusterKey, worker_runtime_env


def test_a_spec_without_a_key_gets_a_new_one_each_time_and_a_fixed_one_is_kept():
    first, second = with_cluster_key(ClusterSpec()), with_cluster_key(ClusterSpec())
    assert first.cluster_key and second.cluster_key and first.cluster_key != second.cluster_key
    assert with_cluster_key(first).cluster_key == first.cluster_key
    assert first.cluster_key[41:] not in repr(first)  # the secret is never printed with the spec


def test_a_malformed_key_in_a_spec_is_refused():
    with pytest.raises((SpecError, ValueError), match=ENV_VAR):
        parse_spec({"cluster_key": "not-a-key"})


def test_the_worker_environment_carries_the_key():
    key = ClusterKey.generate()
    assert ClusterKey.parse(worker_runtime_env(key)["env_vars"][ENV_VAR]) == key
    assert worker_runtime_env(None) == {}
