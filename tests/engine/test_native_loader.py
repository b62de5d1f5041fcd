"""The native kernels' loader never waits forever on a lock a killed build left behind."""

import os
import time

from engine.native.loader import clear_stale_build_lock


def test_a_stale_lock_is_removed_and_a_live_one_kept(tmp_path):
    assert not clear_stale_build_lock(tmp_path)  # no lock: nothing to do
    lock = tmp_path / "lock"
    lock.touch()
    assert not clear_stale_build_lock(tmp_path, max_age_s=600) and lock.exists()  # a build is running
    hour_ago = time.time() - 3600
    os.utime(lock, (hour_ago, hour_ago))
    assert clear_stale_build_lock(tmp_path, max_age_s=600) and not lock.exists()
