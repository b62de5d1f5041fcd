"""What every benchmark section in BENCHMARKS.md states about where it ran: the machine and the commit."""

from __future__ import annotations

import datetime
import os
import platform
import subprocess


def instruction_set() -> str:
    """The widest vector extensions this CPU reports (what the kernels could use), e.g. "AVX-512 (BF16, AMX)"."""
    flags = set(next((ln.split(":", 1)[1].split() for ln in open("/proc/cpuinfo") if ln.startswith("flags")), []))
    if "avx512f" in flags:
        extras = [name for flag, name in (("avx512_bf16", "BF16"), ("amx_tile", "AMX")) if flag in flags]
        return "AVX-512" + (f" ({', '.join(extras)})" if extras else "")
    return "AVX2" if "avx2" in flags else "no AVX2"


def machine_line(*versions: str) -> str:
    """CPU model and instruction set, cores, load average now (the machine is shared), then `versions` and Python's."""
    cpu = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")), None)
    return ", ".join([
        f"{cpu or platform.processor() or 'unknown CPU'} ({instruction_set()})",
        f"{len(os.sched_getaffinity(0))} cores",
        f"shared with other work: load average {os.getloadavg()[0]:.1f} at the end",
        *versions,
        f"Python {platform.python_version()}",
    ])  # fmt: skip


def git_commit() -> str:
    return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()


def append_section(markdown_path: str, script: str, argv: list[str], machine: str, details: str, table: str) -> None:
    """Append `### <command>`, when/commit/machine, `details` and the table to BENCHMARKS.md (or any file)."""
    command = " ".join([f"python scripts/{script}", *argv])
    with open(markdown_path, "a") as f:
        f.write(
            f"\n### `{command}`\n\n"
            f"Run of {datetime.datetime.now():%Y-%m-%d %H:%M}, commit {git_commit()}, on {machine}.\n"
            f"{details}\n\n{table}\n"
        )
