"""An embedded Ray's orphans: what the serving process saw of its descendants is what it kills."""

from __future__ import annotations

import subprocess
import sys
import time

from cluster.ray_leftovers import EmbeddedRayProcesses


def _sleeper() -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])


def test_the_descendants_noted_are_killed_and_those_never_seen_are_left():
    seen, unseen = _sleeper(), None
    try:
        processes = EmbeddedRayProcesses()
        processes.note()
        unseen = _sleeper()  # started after the last look: not known to be Ray's
        assert processes.end() == 1
        assert seen.wait(timeout=10) == -9
        time.sleep(0.2)
        assert unseen.poll() is None
        assert processes.end() == 0  # already gone: nothing to kill twice
    finally:
        for proc in (seen, unseen):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
