"""What every benchmark section in BENCHMARKS.md states about where it ran: the machine and the commit."""

from __future__ import annotations

import os
import platform
import subprocess


def machine_line(*versions: str) -> str:
    """CPU model, cores, load average now (the machine is shared), then `versions` and Python's."""
    cpu = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")), None)
    return ", ".join([
        f"{cpu or platform.processor() or 'unknown CPU'}",
        f"{len(os.sched_getaffinity(0))} cores (shared with other work: load average {os.getloadavg()[0]:.1f} at the end)",
        *versions,
        f"Python {platform.python_version()}",
    ])  # fmt: skip


def git_commit() -> str:
    return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
