"""The reliability table: run the fault-injection e2e tests and write what each one saw to RELIABILITY.md.

    python scripts/bench_faults.py                 # replaces the table of RELIABILITY.md
    python scripts/bench_faults.py --out other.md

Each test of tests/e2e/test_serve_faults.py (a deployment as `tandem serve` runs
it, default timeouts) and tests/e2e/test_faults.py (transport faults injected
into a hand-wired stack, some KV timeouts shortened so a fault ends in seconds:
the row says which) injects one fault and writes a row (fault, timeouts,
requests in flight, completed, lost, worker restarts, blocks left held by the
survivors) to the file named by TANDEM_FAULT_REPORT; this script sets it, runs
pytest, and writes the rows as one table under RELIABILITY.md's description of
what happens on each fault (the text above its first `### ` heading, kept). A
failing test still leaves its row (its numbers say what went wrong); the script
then exits non-zero.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_report  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
COLUMNS = [("fault", "fault injected"), ("timeouts", "timeouts"), ("in_flight", "requests in flight"),
           ("completed", "completed"), ("lost", "lost"), ("restarts", "worker restarts"),
           ("leaked_blocks", "leaked blocks")]  # fmt: skip
TESTS = ("tests/e2e/test_serve_faults.py", "tests/e2e/test_faults.py")
SUMMED = ("in_flight", "completed", "lost", "leaked_blocks")


def run_tests(report: Path) -> int:
    env = {**os.environ, "TANDEM_FAULT_REPORT": str(report)}
    # `-o addopts=`: one test at a time, as the table says, not two at a time as the suite runs
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=", *TESTS]
    return subprocess.run(command, cwd=ROOT, env=env).returncode


def table(rows: list[dict]) -> str:
    lines = ["| " + " | ".join(title for _, title in COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(str(row[key]) for key, _ in COLUMNS) + " |" for row in rows]
    total = {key: f"**{sum(row[key] for row in rows)}**" if key in SUMMED else "" for key, _ in COLUMNS[1:]}
    lines.append("| **all** | " + " | ".join(total[key] for key, _ in COLUMNS[1:]) + " |")
    return "\n".join(lines)


def keep_description(path: Path) -> None:
    """Cut the file back to its description (above the first `### `): the new table replaces the old."""
    text = path.read_text() if path.exists() else "# Reliability\n"
    path.write_text(text.split("\n### ", 1)[0].rstrip() + "\n")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(ROOT / "RELIABILITY.md"))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "rows.jsonl"
        status = run_tests(report)
        rows = [json.loads(line) for line in report.read_text().splitlines()] if report.exists() else []
    import torch

    details = (
        "Each row is one test: `tests/e2e/test_serve_faults.py` (a deployment as `tandem serve` runs it, "
        "default timeouts) or `tests/e2e/test_faults.py` (router, prefill and decode actors on a local Ray, "
        "transport faults injected, the KV timeouts named shortened); tiny llama, greedy. *completed*: the "
        "client got the whole text equal to transformers' greedy generate; *lost*: any other end (an error "
        "where none was configured, a gap, a hang); *worker restarts*: restarts by the controller (– where "
        "there is none); *leaked blocks*: blocks still held by the surviving workers once idle. With "
        "`kv_transfer_failure=fail` every request is answered with the configured error, neither completed "
        "nor lost."
        + ("" if status == 0 else f"\n\n**pytest exited {status}: some tests failed.**")
    )
    keep_description(Path(args.out))
    bench_report.append_section(args.out, "bench_faults.py", sys.argv[1:], bench_report.machine_line(
        f"torch {torch.__version__}"), details, table(rows))  # fmt: skip
    print(table(rows))
    return status


if __name__ == "__main__":
    sys.exit(main())
