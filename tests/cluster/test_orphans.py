"""The controller's watch on the serving process: it fires once that process has ended, and a pid
reused by another process is not taken for it. Real processes, no Ray."""

from __future__ import annotations

import subprocess
import sys
import threading

import psutil

from cluster.orphans import ServingProcess, watch_serving_process
from tests.e2e.harness import wait_for


def test_the_watch_fires_once_the_serving_process_ended():
    serving = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        process = ServingProcess(serving.pid, psutil.Process(serving.pid).create_time())
        gone = threading.Event()
        watch_serving_process(process, gone.set, interval_s=0.01)
        assert process.alive() and not gone.wait(0.2)
    finally:
        serving.kill()
        serving.wait()
    wait_for(gone.is_set, "the watch to see the serving process gone")
    assert not process.alive()


def test_another_process_under_the_same_pid_is_not_the_serving_process():
    this = ServingProcess.this()
    assert this.alive() and not ServingProcess(this.pid, this.started + 1).alive()
