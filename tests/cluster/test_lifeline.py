"""`tandem serve`'s lifeline: the cluster is gone when its GCS refuses connections, or when Ray says the
controller actor is dead for good; a controller being restarted (slow to answer) is not gone. Gone while
`tandem serve` is still starting, the main thread is interrupted; once it waits in `wait`, that raises."""

from __future__ import annotations

import socket
import threading
import time

import pytest
from ray.exceptions import ActorDiedError, GetTimeoutError

from cluster.lifeline import ClusterGone, Lifeline, gcs_reachable


class Controller:
    def __init__(self, *errors):
        self.errors, self.pings = list(errors), 0

    def ping(self, timeout_s: float) -> None:
        self.pings += 1
        error = self.errors.pop(0) if self.errors else None
        if error is not None:
            raise error


class Interrupts:
    def __init__(self):
        self.count, self.called = 0, threading.Event()

    def __call__(self) -> None:
        self.count += 1
        self.called.set()


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


def test_a_gcs_gone_during_start_up_interrupts_the_main_thread(refusing, listening):
    assert gcs_reachable(listening) and not gcs_reachable(refusing)
    interrupts = Interrupts()
    lifeline = Lifeline(refusing, interval_s=0.01, interrupt=interrupts, give_up=pytest.fail).start()
    assert interrupts.called.wait(10) and interrupts.count == 1
    lifeline.stop()  # as `tandem serve` does once the interrupt reached it: no last resort then
    assert isinstance(lifeline.gone, ClusterGone) and not lifeline.gone.ray_alive
    assert "the Ray cluster is gone" in str(lifeline.gone) and lifeline.confirm_gone()


def test_a_controller_dead_for_good_ends_the_wait_but_a_restarting_one_does_not(listening):
    # Timeouts (a restart under way) and one death answer between successes are survived...
    controller = Controller(GetTimeoutError(), GetTimeoutError(), ActorDiedError(), None, *[ActorDiedError()] * 3)
    interrupts = Interrupts()
    lifeline = Lifeline(listening, interval_s=0.001, interrupt=interrupts)
    lifeline.watch_controller(controller)
    lifeline.start()
    with pytest.raises(ClusterGone, match="dead for good") as gone:
        lifeline.wait()
    assert gone.value.ray_alive and controller.pings == 7  # ...three death answers in a row are not
    assert interrupts.count == 0  # the main thread was already waiting where it learns it


def test_a_stopped_lifeline_tells_nobody_and_a_failure_with_ray_up_is_not_blamed_on_it(refusing, listening):
    interrupts = Interrupts()
    lifeline = Lifeline(refusing, interval_s=0.05, interrupt=interrupts).start()
    lifeline.stop()
    assert not interrupts.called.wait(0.5) and lifeline.gone is None
    assert not Lifeline(listening).confirm_gone()  # the GCS answers: a failed call failed on its own


def test_a_main_thread_deaf_to_the_interrupt_is_given_up_on_after_the_grace(refusing):
    interrupts, given_up = Interrupts(), []
    lifeline = Lifeline(refusing, interval_s=0.01, grace_s=0.2, interrupt=interrupts, give_up=given_up.append).start()
    assert interrupts.called.wait(10)
    deadline = time.monotonic() + 10
    while not given_up and time.monotonic() < deadline:
        time.sleep(0.01)
    assert given_up == [lifeline.gone]
    heard = Lifeline(refusing, interval_s=0.01, grace_s=0.5, interrupt=lambda: None, give_up=given_up.append)
    heard.start()
    while heard.gone is None:
        time.sleep(0.01)
    heard.stop()  # what `tandem serve`'s cleanup does first once the interrupt reached it
    time.sleep(0.7)
    assert given_up == [lifeline.gone]


def test_the_last_resort_removes_the_admin_token_file_this_process_wrote(tmp_path, monkeypatch, capsys):
    from cluster import lifeline
    from cluster.admin_token import forget_token, token_path, write_token

    monkeypatch.setenv("TANDEM_CACHE_DIR", str(tmp_path))
    ours = write_token("127.0.0.1", 8123, "ours")
    write_token("127.0.0.1", 8124, "other")
    forget_token("127.0.0.1", 8124, "other")  # forgotten by the cleanup already: nothing left to do for it
    others = write_token("127.0.0.1", 8125, "someone else's")
    others.write_text("a later server's")  # the port was taken over since: its file is not ours to remove
    exits = []
    monkeypatch.setattr(lifeline.os, "_exit", exits.append)
    lifeline.exit_now(ClusterGone("the Ray cluster is gone", False))
    assert exits == [1] and "tandem: error: the Ray cluster is gone" in capsys.readouterr().out
    assert not ours.exists() and not token_path("127.0.0.1", 8124).exists() and others.read_text() == "a later server's"
