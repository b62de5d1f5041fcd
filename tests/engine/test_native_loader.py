"""The native kernels' loader never waits forever on a lock a killed build left behind: it waits while the
build beside the lock is alive (writing files), and removes the lock once that build has gone idle."""

import os
import threading
import time

from engine.native.loader import wait_out_build_lock


def age(path, seconds: float) -> None:
    then = time.time() - seconds
    os.utime(path, (then, then))


def test_no_lock_no_wait_and_a_stale_one_is_removed(tmp_path):
    assert not wait_out_build_lock(tmp_path)  # no lock: nothing to do
    lock, built = tmp_path / "lock", tmp_path / "layer_ops.o"
    lock.touch()
    built.touch()
    age(lock, 3600)
    age(built, 3600)
    assert wait_out_build_lock(tmp_path, max_idle_s=600) and not lock.exists()


def test_a_live_build_is_waited_for_until_it_releases_its_lock(tmp_path):
    lock = tmp_path / "lock"
    lock.touch()
    age(lock, 3600)  # an old lock, but the build beside it keeps writing: alive
    (tmp_path / "paged_decode.o").touch()
    threading.Timer(0.3, lock.unlink).start()  # the builder finishes
    assert not wait_out_build_lock(tmp_path, max_idle_s=600, poll_s=0.02)  # False: the builder removed it, not we


def test_a_lock_left_by_a_build_killed_a_moment_ago_is_removed_once_idle_not_waited_on_forever(tmp_path):
    lock = tmp_path / "lock"
    lock.touch()  # young: the check at start would have kept it, and torch would wait on it forever
    assert wait_out_build_lock(tmp_path, max_idle_s=0.2, poll_s=0.02) and not lock.exists()
