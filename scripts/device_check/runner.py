"""Run one step of the check: its own process group, its own time budget, its whole output in OUT_DIR.

A step writes OUT_DIR/NAME.log while it runs; once it has ended, that log is appended to
OUT_DIR/steps.log (every step's output in order) and removed, so OUT_DIR stays under the eight files
a lent GPU machine sends back however many steps there are.

A step that hangs is killed with everything it started (its process group) when its budget is
spent, so it costs its budget and no more; the check's overall deadline caps every budget.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from .step_io import FIGURE, SKIP, SKIPPED

# Under this many seconds left, a step is not started: it could not finish.
MIN_START_S = 10
STEPS_LOG = "steps.log"


@dataclass
class Step:
    name: str
    argv: list[str]
    budget_s: float
    env: dict[str, str] = field(default_factory=dict)
    # Figures read after the step ends (a benchmark's JSON), beside those it printed.
    read_figures: Callable[[], dict[str, str]] | None = None


@dataclass
class StepResult:
    name: str
    status: str  # "passed", "failed" or "skipped"
    seconds: float = 0.0
    budget_s: float = 0.0
    reason: str = ""
    figures: dict[str, str] = field(default_factory=dict)
    log: str = ""  # the file in OUT_DIR that holds its output


def skipped(name: str, reason: str) -> StepResult:
    return StepResult(name, "skipped", reason=reason)


def run_step(step: Step, out_dir: Path, deadline: float, env: dict[str, str]) -> StepResult:
    """Run `step` until it ends or its budget (at most what is left before `deadline`) is spent."""
    left = deadline - time.monotonic()
    if left < MIN_START_S:
        return skipped(step.name, f"not started: {max(0, left):.0f} s left of the check's time")
    budget = min(step.budget_s, left)
    log = out_dir / f"{step.name}.log"
    print(f"[{step.name}] running, budget {budget:.0f} s: {shlex.join(step.argv)}", flush=True)
    start = time.monotonic()
    with open(log, "w") as out:
        out.write(f"$ {shlex.join(step.argv)}\n")
        out.flush()
        proc = subprocess.Popen(step.argv, stdout=out, stderr=subprocess.STDOUT, env={**env, **step.env},
                                start_new_session=True)  # fmt: skip
        code = _wait(proc, budget)
    result = _result(step, code, log, budget)
    result.seconds = time.monotonic() - start
    result.log = _appended(log, out_dir / STEPS_LOG)
    print(f"[{step.name}] {result.status} in {result.seconds:.0f} s{': ' + result.reason if result.reason else ''}",
          flush=True)  # fmt: skip
    return result


def _wait(proc: subprocess.Popen, budget: float) -> int | None:
    """The exit status, or None when the budget ran out (the step's whole process group is killed)."""
    try:
        return proc.wait(timeout=budget)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        return None
    finally:
        _kill_leftovers(proc.pid)


def _kill_leftovers(pgid: int) -> None:
    """A step's children outliving it (a peer process) would hold the GPU into the next step."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _result(step: Step, code: int | None, log: Path, budget: float) -> StepResult:
    lines = [line.rstrip() for line in log.read_text(errors="replace").splitlines() if line.strip()]
    figures = {m["name"]: m["value"] for m in map(FIGURE.match, lines) if m}
    result = StepResult(step.name, "failed", budget_s=budget, figures=figures)
    if code is None:
        result.reason = f"timed out after {budget:.0f} s (its process group was killed)"
        return result
    if step.read_figures is not None and code == 0:
        try:
            figures.update(step.read_figures())
        except (OSError, ValueError, KeyError) as err:
            code, lines = 1, [*lines, f"its figures could not be read: {type(err).__name__}: {err}"]
    if code == 0:
        result.status = "passed"
    elif code == SKIPPED:
        result.status = "skipped"
        result.reason = next((m["reason"] for m in map(SKIP.match, reversed(lines)) if m), "skipped")
    else:
        result.reason = f"exit status {code}: {lines[-1] if lines else 'no output'}"
    return result


def _appended(log: Path, steps_log: Path) -> str:
    with open(steps_log, "a") as out:
        out.write(f"==== {log.stem} ====\n{log.read_text(errors='replace')}\n")
    log.unlink()
    return steps_log.name


def child_env(repo: Path, extra: dict[str, str]) -> dict[str, str]:
    """The environment of every step: the repository importable without installing it, no hub access."""
    path = [str(repo), str(repo / "scripts"), os.environ.get("PYTHONPATH", "")]
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(p for p in path if p),
        "PYTHONUNBUFFERED": "1",
        "HF_HUB_OFFLINE": "1",  # the GPU machine has no network: fail at once rather than after timeouts
        "TOKENIZERS_PARALLELISM": "false",
        "PYTHONDONTWRITEBYTECODE": "1",
        **extra,
    }

