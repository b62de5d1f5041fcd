"""An embedded Ray's orphans: what the serving process saw of its descendants is what it kills.

The serving process here is a child of the test's, so that the test's own children (a Ray that an earlier
test file left running in this process: the suite runs files two at a time, in any order) are never counted."""

from __future__ import annotations

import subprocess
import sys
import time

import psutil

from cluster.ray_leftovers import EmbeddedRayProcesses

# Starts a sleeper and prints its pid, then another one each time a line arrives on its stdin.
SERVING = """
import subprocess, sys
def sleeper():
    print(subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]).pid, flush=True)
sleeper()
for _ in sys.stdin:
    sleeper()
"""


def test_the_descendants_noted_are_killed_and_those_never_seen_are_left():
    serving = subprocess.Popen([sys.executable, "-c", SERVING], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               text=True)  # fmt: skip
    try:
        seen = psutil.Process(int(serving.stdout.readline()))
        processes = EmbeddedRayProcesses(serving.pid)
        processes.note()
        serving.stdin.write("another\n")
        serving.stdin.flush()
        unseen = psutil.Process(int(serving.stdout.readline()))  # started after the last look: not known to be Ray's
        assert processes.end() == 1
        assert _ends(seen, timeout_s=10)
        time.sleep(0.2)
        assert not _ends(unseen, timeout_s=0)
        assert processes.end() == 0  # already gone: nothing to kill twice
    finally:
        for child in psutil.Process(serving.pid).children(recursive=True):
            child.kill()
        serving.kill()
        serving.wait()


def _ends(process: psutil.Process, timeout_s: float) -> bool:
    """Whether `process` ended within `timeout_s` (a zombie has: its parent here never reaps it)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if process.status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)
