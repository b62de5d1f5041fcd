"""What `tandem serve` keeps watching from its connect to its end: that its cluster is there.

Every `interval_s` a thread checks that

  - the Ray cluster is there: its GCS accepts connections (an embedded Ray that was
    killed, the head node of `--address` gone: the workers went with it);
  - once `tandem serve` has a controller, that it is alive or being restarted by Ray (a
    call then waits for it): Ray answering that it is dead (`ActorDiedError`) means it
    used up its restarts.

Either one failing `misses_before_gone` checks in a row is `ClusterGone`, kept in
`Lifeline.gone`. The main thread learns it wherever it is: in `Lifeline.wait` once
serving, and during start-up by an interrupt, as Ctrl-C would: Ray's waits for
results check for signals. Some of its calls do not (an actor's creation writes to
the GCS and waits for Ray's own 60 s exit, deaf to signals): when the main thread
has not stopped the lifeline `grace_s` after the interrupt, the lifeline says why
and ends the process itself (`exit_now`), with Ray already gone. `tandem serve`
thus stops what is left and exits non-zero instead of serving nothing forever, or
hanging in its start.
"""

from __future__ import annotations

import _thread
import os
import socket
import threading
from collections.abc import Callable


class ClusterGone(RuntimeError):
    """The cluster `tandem serve` runs on cannot serve any more; `ray_alive`: whether Ray itself still is."""

    def __init__(self, why: str, ray_alive: bool):
        super().__init__(why)
        self.ray_alive = ray_alive


class Lifeline:
    """The watch over one `tandem serve`'s cluster, from a daemon thread (`start` .. `stop`)."""

    def __init__(self, gcs_address: str, interval_s: float = 1.0, misses_before_gone: int = 3, grace_s: float = 5.0,
                 interrupt: Callable[[], None] = _thread.interrupt_main,
                 give_up: Callable[[ClusterGone], None] | None = None,
                 on_check: Callable[[], None] = lambda: None):  # fmt: skip
        """`on_check` runs on the lifeline's thread after each check that found Ray's GCS there."""
        self.gcs_address, self.interval_s, self.misses_before_gone = gcs_address, interval_s, misses_before_gone
        self._on_check = on_check
        self.grace_s = grace_s
        self.gone: ClusterGone | None = None
        self._interrupt, self._give_up = interrupt, give_up or exit_now
        self._controller = None  # a ControllerClient once `tandem serve` has one
        self._lock = threading.Lock()
        self._ended = threading.Event()  # gone, or stopped
        self._stopped = threading.Event()
        self._main_waits = False

    def start(self) -> Lifeline:
        threading.Thread(target=self._run, name="tandem-lifeline", daemon=True).start()
        return self

    def watch_controller(self, controller) -> None:
        self._controller = controller

    def wait(self) -> None:
        """The main thread's wait once serving: until the cluster is gone (raises `ClusterGone`). Short
        waits, so that a signal (Ctrl-C, SIGTERM) ends it at once."""
        with self._lock:
            self._main_waits = True
        while not self._ended.wait(0.5):
            pass
        if self.gone is not None:
            raise self.gone

    def confirm_gone(self) -> bool:
        """For a start-up call that failed: whether the cluster went under it. With its GCS unreachable
        now, waits for the verdict (a few checks) rather than blame the call."""
        if self.gone is None and not self._ended.is_set() and not gcs_reachable(self.gcs_address):
            self._ended.wait(self.interval_s * (self.misses_before_gone + 2))
        return self.gone is not None

    def stop(self) -> None:
        """No more checks, and no interrupt from here on (the main thread is cleaning up)."""
        with self._lock:
            self._ended.set()
            self._stopped.set()

    def _run(self) -> None:
        try:
            self._watch()
        except ClusterGone as err:
            with self._lock:
                if self._ended.is_set():
                    return  # stopped meanwhile: nobody to tell
                self.gone = err
                self._ended.set()
                if self._main_waits:
                    return  # `wait` raises it
                self._interrupt()  # the main thread is starting up, somewhere in a call
            if not self._stopped.wait(self.grace_s):
                self._give_up(err)  # ...in one deaf to signals

    def _watch(self) -> None:
        gcs_misses = controller_misses = 0
        while not self._ended.wait(self.interval_s):
            gcs_misses = 0 if gcs_reachable(self.gcs_address) else gcs_misses + 1
            if gcs_misses >= self.misses_before_gone:
                raise ClusterGone(f"the Ray cluster is gone: its GCS at {self.gcs_address} refuses connections", False)
            if not gcs_misses:
                self._on_check()
            if gcs_misses or self._controller is None:
                continue  # no call through Ray while its GCS is away: one could wait past Ray's own 60 s exit
            alive = controller_alive(self._controller, self.interval_s * 10)
            controller_misses = 0 if alive else controller_misses + 1
            if controller_misses >= self.misses_before_gone:
                raise ClusterGone("the controller actor is dead for good (Ray will not restart it again)", True)


def exit_now(gone: ClusterGone, embedded_ray=None) -> None:
    """The last resort when the main thread is stuck in a call through a Ray that is gone: say so, end.
    Of the cleanup it skips, the admin token's file and an embedded Ray's orphaned processes
    (`cluster.ray_leftovers.EmbeddedRayProcesses`) would outlive the process: they are ended here."""
    from cluster.admin_token import forget_written

    print(f"tandem: {gone}; shutting down\ntandem: error: {gone}", flush=True)
    forget_written()
    if embedded_ray is not None and not gone.ray_alive:
        embedded_ray.end()
    os._exit(1)


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
