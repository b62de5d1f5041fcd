"""One local Ray shared by the end-to-end tests that use `ray_session` (ray.init costs seconds).

It starts on first use and stays up across modules; a module that needs a Ray of
its own (a simulated multi-node cluster) shuts it down first, and the next module
that asks for `ray_session` starts a fresh one.
"""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def ray_session():
    import ray

    if not ray.is_initialized():
        ray.init(
            address="local",  # always a fresh Ray of our own, never one another process registered on this host
            num_cpus=4,
            _node_ip_address="127.0.0.1",
            include_dashboard=False,
            logging_level="WARNING",
            log_to_driver=False,
            configure_logging=False,
        )
    return ray


@pytest.fixture(scope="session", autouse=True)
def _shut_ray_down_at_the_end():
    yield
    import sys

    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        ray.shutdown()
