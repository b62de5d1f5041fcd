"""One local Ray for every end-to-end test of the session (ray.init costs seconds)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def ray_session():
    import ray

    ray.init(
        address="local",  # always a fresh Ray of our own, never one another process registered on this host
        num_cpus=4,
        _node_ip_address="127.0.0.1",
        include_dashboard=False,
        logging_level="WARNING",
        log_to_driver=False,
        configure_logging=False,
    )
    yield ray
    ray.shutdown()
