"""What the check leaves behind: a table of its steps on stdout and in summary.md, results.json, the exit status.

OUT_DIR holds summary.md, results.json, steps.log (runner.py) and what a step writes there (the
measured profile): under the eight files a lent GPU machine sends back.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

from .runner import StepResult


def table(results: list[StepResult]) -> str:
    lines = ["| step | result | time | notes |", "|---|---|---|---|"]
    for r in results:
        time_cell = f"{r.seconds:.0f} s of {r.budget_s:.0f}" if r.budget_s else "-"
        lines.append(f"| {r.name} | {r.status} | {time_cell} | {_cell(r.reason) or '-'} |")
    return "\n".join(lines)


def figure_lines(results: list[StepResult]) -> list[str]:
    return [f"- {r.name}: {name}: {value}" for r in results for name, value in r.figures.items()]


def summary(title: str, header: list[str], results: list[StepResult], records: dict[str, str]) -> str:
    """summary.md: what ran where, the table, the key figures, then the benchmarks' own records."""
    parts = [f"# {title}", "", *[f"- {line}" for line in header], "", table(results), ""]
    figures = figure_lines(results)
    if figures:
        parts += ["## Key figures", "", *figures, ""]
    for name, record in records.items():
        parts += [f"## Record {name}", "", _demoted(record.strip()), ""]
    return "\n".join(parts)


def write(out_dir: Path, text: str, results: list[StepResult], header: list[str], records: dict[str, str]) -> None:
    (out_dir / "summary.md").write_text(text)
    raw = {"header": header, "steps": [asdict(r) for r in results], "records": records}
    (out_dir / "results.json").write_text(json.dumps(raw, indent=1))


def exit_status(results: list[StepResult]) -> int:
    """1 when any step failed; skipped steps (said why) do not fail the check."""
    return 1 if any(r.status == "failed" for r in results) else 0


def _demoted(record: str) -> str:
    """A record's headings under its `## Record` heading (the records hold no code blocks)."""
    return "\n".join("##" + line if line.startswith("#") else line for line in record.splitlines())


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")
