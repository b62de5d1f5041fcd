"""An embedded Ray's orphans: what the serving process saw of its descendants is what it kills.

The serving process here is a child of the test's, so that the test's own children (a Ray that an earlier
test file left running in this process: the suite runs files two at a time, in any order) are never counted."""

from __future__ import annotations

import subprocess
import sys
import time

import psutil

from cluster.ray_leftovers import EmbeddedRayProcesses, running
from tests.e2e.harness import wait_for

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
        wait_for(lambda: not running(seen), "the noted process to end", timeout_s=10)
        time.sleep(0.2)
        assert running(unseen)
        assert processes.end() == 0  # already gone: nothing to kill twice
    finally:
        for child in psutil.Process(serving.pid).children(recursive=True):
            child.kill()
        serving.kill()
        serving.wait()

