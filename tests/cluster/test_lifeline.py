"""`tandem serve` stops waiting when its cluster is gone: the GCS refusing connections, or Ray saying the
controller actor is dead for good; a controller being restarted (slow to answer) is not gone."""

from __future__ import annotations

import socket

import pytest
from ray.exceptions import ActorDiedError, GetTimeoutError

from cluster.lifeline import ClusterGone, gcs_reachable, wait_while_alive


class Controller:
    def __init__(self, *errors):
        self.errors, self.pings = list(errors), 0

    def ping(self, timeout_s: float) -> None:
        self.pings += 1
        error = self.errors.pop(0) if self.errors else None
        if error is not None:
            raise error


@pytest.fixture
def listening():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield f"127.0.0.1:{sock.getsockname()[1]}"


@pytest.fixture
def refusing():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))  # bound, not listening: connections are refused
        yield f"127.0.0.1:{sock.getsockname()[1]}"


def test_a_gcs_that_refuses_connections_means_ray_is_gone(refusing, listening):
    assert gcs_reachable(listening) and not gcs_reachable(refusing)
    with pytest.raises(ClusterGone, match="the Ray cluster is gone") as gone:
        wait_while_alive(Controller(), refusing, interval_s=0.001)
    assert not gone.value.ray_alive


def test_a_controller_dead_for_good_ends_the_wait_but_a_restarting_one_does_not(listening):
    # Timeouts (a restart under way) and one death answer between successes are survived...
    controller = Controller(GetTimeoutError(), GetTimeoutError(), ActorDiedError(), None, *[ActorDiedError()] * 3)
    with pytest.raises(ClusterGone, match="dead for good") as gone:
        wait_while_alive(controller, listening, interval_s=0.001)
    assert gone.value.ray_alive and controller.pings == 7  # ...three death answers in a row are not
