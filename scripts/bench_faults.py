"""The reliability table: run the fault-injection e2e tests and write what each one saw to RELIABILITY.md.

    python scripts/bench_faults.py                 # appends a section to RELIABILITY.md
    python scripts/bench_faults.py --out other.md

Each test of tests/e2e/test_faults.py injects one fault into a live stack
(router, prefill and decode actors on a local Ray, tiny llama) and writes a
row (fault, requests in flight, completed, lost, blocks left held by the
surviving workers) to the file named by TANDEM_FAULT_REPORT; this script sets
it, runs pytest, and turns the rows into a markdown table. A failing test still
leaves its row (its numbers say what went wrong); the script then exits non-zero.
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
COLUMNS = [("fault", "fault injected"), ("in_flight", "requests in flight"), ("completed", "completed"),
           ("lost", "lost"), ("leaked_blocks", "leaked blocks")]  # fmt: skip


def run_tests(report: Path) -> int:
    env = {**os.environ, "TANDEM_FAULT_REPORT": str(report)}
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/e2e/test_faults.py"]
    return subprocess.run(command, cwd=ROOT, env=env).returncode


def table(rows: list[dict]) -> str:
    lines = ["| " + " | ".join(title for _, title in COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(str(row[key]) for key, _ in COLUMNS) + " |" for row in rows]
    total = {key: sum(row[key] for row in rows) for key, _ in COLUMNS[1:]}
    lines.append("| **all** | " + " | ".join(f"**{total[key]}**" for key, _ in COLUMNS[1:]) + " |")
    return "\n".join(lines)


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
        "Each row is one test of `tests/e2e/test_faults.py` (router, prefill and decode actors on a local Ray, "
        "tiny llama, greedy). *completed*: the client got the whole text equal to transformers' greedy "
        "generate; *lost*: any other end (an error where none was configured, a gap, a hang); *leaked blocks*: "
        "blocks still held by the surviving workers once idle. With `kv_transfer_failure=fail` every request "
        "is answered with the configured error, neither completed nor lost."
        + ("" if status == 0 else f"\n\n**pytest exited {status}: some tests failed.**")
    )
    bench_report.append_section(args.out, "bench_faults.py", sys.argv[1:], bench_report.machine_line(
        f"torch {torch.__version__}"), details, table(rows))  # fmt: skip
    print(table(rows))
    return status


if __name__ == "__main__":
    sys.exit(main())
