"""What `tandem serve` waits on once it serves: a signal, or its cluster gone for good.

Every `interval_s` it checks that

  - the Ray cluster is there: its GCS accepts connections (an embedded Ray that was
    killed, the head node of `--address` gone: the workers went with it);
  - the controller actor is alive, or being restarted by Ray (a call then waits for it):
    Ray answering that it is dead (`ActorDiedError`) means it used up its restarts.

Either one failing `misses_before_gone` checks in a row raises `ClusterGone`
saying which, and `tandem serve` stops what is left and exits non-zero instead of
serving nothing forever. A signal ends the wait as before (KeyboardInterrupt).
"""

from __future__ import annotations

import socket
import time


class ClusterGone(RuntimeError):
    """The cluster `tandem serve` runs on cannot serve any more; `ray_alive`: whether Ray itself still is."""

    def __init__(self, why: str, ray_alive: bool):
        super().__init__(why)
        self.ray_alive = ray_alive


def wait_while_alive(controller, gcs_address: str, interval_s: float = 1.0, misses_before_gone: int = 3) -> None:
    """Block until the cluster is gone (raises `ClusterGone`); `controller` is a `ControllerClient`."""
    gcs_misses = controller_misses = 0
    while True:
        time.sleep(interval_s)
        gcs_misses = 0 if gcs_reachable(gcs_address) else gcs_misses + 1
        if gcs_misses >= misses_before_gone:
            raise ClusterGone(f"the Ray cluster is gone: its GCS at {gcs_address} refuses connections", False)
        if gcs_misses:
            continue  # no call through Ray while its GCS is away: one could wait past Ray's own 60 s exit
        controller_misses = 0 if controller_alive(controller, interval_s * 10) else controller_misses + 1
        if controller_misses >= misses_before_gone:
            raise ClusterGone("the controller actor is dead for good (Ray will not restart it again)", True)


def gcs_reachable(address: str, timeout_s: float = 2.0) -> bool:
    host, port = address.rsplit(":", 1)
    try:
        socket.create_connection((host, int(port)), timeout=timeout_s).close()
    except OSError:
        return False
    return True


def controller_alive(controller, timeout_s: float) -> bool:
    """False only when Ray says the actor is dead; a slow answer (a restart under way) is not death."""
    from ray.exceptions import ActorDiedError, GetTimeoutError

    try:
        controller.ping(timeout_s)
    except GetTimeoutError:
        return True
    except ActorDiedError:
        return False
    return True
