"""A worker process lowers the niceness Ray gave it, or says why it cannot (runtime.priority)."""

from __future__ import annotations

import os
import subprocess
import sys

SCRIPT = """
import logging, os, sys
logging.basicConfig(level=logging.WARNING, stream=sys.stdout)
os.nice(5)  # as a Ray worker starts: niceness above 0
from runtime.priority import run_at_normal_priority
print("niceness", run_at_normal_priority("decode-0"), os.nice(0))
"""


def test_a_niced_worker_returns_to_normal_priority_or_warns():
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, check=True).stdout
    if os.geteuid() == 0:  # may lower its niceness: it does
        assert "niceness 0 0" in out and "WARNING" not in out, out
    else:  # may not: it stays and says how to start Ray instead
        assert "niceness 5 5" in out and "RAY_worker_niceness=0" in out, out
