"""What every benchmark record states about where it ran (the machine, the commit), and where a record goes.

    bench_report.record_run("BENCHMARKS.md", "bench_engine.py", text)

A run's full record becomes a new file, `benchmarks/history/<date>-<time>-<script>.md` beside
BENCHMARKS.md, and replaces the script's latest result in BENCHMARKS.md, between its markers:

    <!-- bench_engine:latest -->
    ... the last run's record, headings moved under the script's section ...
    <!-- /bench_engine:latest -->

Nothing else in BENCHMARKS.md changes, so its sections stay one per script, whatever runs.
A file without the markers (a scratch file, a first run) gets a new section at its end.
"""

from __future__ import annotations

import datetime
import os
import platform
import re
import subprocess
from pathlib import Path

from engine.cpu_features import cpu_features, max_isa

# What caps PyTorch's kernels (ATen's vectorised ops, oneDNN, MKL) as TANDEM_CPU_MAX_ISA caps ours.
_TORCH_ISA_CAPS = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS")


def instruction_set() -> str:
    """The widest vector extensions this CPU reports (what the kernels could use), e.g. "AVX-512 (BF16, AMX)"."""
    features = cpu_features()
    used = _widest(features.flags)
    if features.hidden:  # TANDEM_CPU_MAX_ISA: a table must not pass for one taken on an older CPU
        torch_caps = " ".join(f"{k}={os.environ[k]}" for k in _TORCH_ISA_CAPS if k in os.environ) or "none"
        return (f"{used}, capped by TANDEM_CPU_MAX_ISA on a CPU with {_widest(features.flags | features.hidden)}; "
                f"PyTorch's own caps: {torch_caps}; vLLM on the kernels it loads there "
                "(cluster_bench.peer_isa)")  # fmt: skip
    return used


def _widest(flags) -> str:
    if "avx512f" in flags:
        extras = [name for flag, name in (("avx512_bf16", "BF16"), ("amx_tile", "AMX")) if flag in flags]
        return "AVX-512" + (f" ({', '.join(extras)})" if extras else "")
    return "AVX2" if "avx2" in flags else "no AVX2"


def add_markdown_option(parser) -> None:
    """`--markdown FILE`: the run's latest result replaces its script's section in FILE (BENCHMARKS.md), and
    its full record goes under benchmarks/history/ beside it (`record_run`)."""
    parser.add_argument("--markdown", default=None, metavar="FILE",
                        help="the run's latest result in FILE (BENCHMARKS.md), its full record under "
                             "benchmarks/history/ beside it")  # fmt: skip


def machine_line(*versions: str) -> str:
    """CPU model and instruction set, cores, load average now (the machine is shared), then `versions` and Python's."""
    return ", ".join([
        f"{cpu_features().model} ({instruction_set()})",
        f"{len(os.sched_getaffinity(0))} cores",
        f"shared with other work: load average {os.getloadavg()[0]:.1f} at the end",
        *versions,
        f"Python {platform.python_version()}",
    ])  # fmt: skip


def git_commit() -> str:
    """HEAD, and "+ uncommitted changes" when the tracked files differ from it (the run measured those)."""
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True)
    return f"{head} + uncommitted changes" if dirty.stdout.strip() else head


def run_text(script: str, argv: list[str], machine: str, details: str, table: str) -> str:
    """`### <command>`, when/commit/machine, `details` and the table: a run's record."""
    command = " ".join([f"python scripts/{script}", *argv])
    return (
        f"### `{command}`\n\n"
        f"Run of {datetime.datetime.now():%Y-%m-%d %H:%M}, commit {git_commit()}, on {machine}.\n"
        f"{details}\n\n{table}\n"
    )


def append_section(markdown_path: str, script: str, argv: list[str], machine: str, details: str, table: str) -> None:
    """Append `run_text(...)` to a file as it is (RELIABILITY.md, which bench_faults cuts back to one table first)."""
    with open(markdown_path, "a") as f:
        f.write("\n" + run_text(script, argv, machine, details, table))


HISTORY = Path("benchmarks") / "history"  # beside the markdown file: BENCHMARKS.md -> benchmarks/history/
SECTION_LEVEL = 3  # a record's top heading, inside its script's `## ` section


def result_key(script: str) -> str:
    """`bench_engine.py` -> "bench_engine"; under a TANDEM_CPU_MAX_ISA that hides something, "bench_engine-avx2":
    a run that plays an older CPU keeps its own latest result and never replaces the machine's own."""
    stem = Path(script).stem
    return f"{stem}-{max_isa()}" if cpu_features().hidden else stem


def markers(script: str) -> tuple[str, str]:
    """The comments around a script's latest result: `bench_engine.py` -> `<!-- bench_engine:latest -->`, ..."""
    key = result_key(script)
    return f"<!-- {key}:latest -->", f"<!-- /{key}:latest -->"


def record_run(markdown_path: str | Path, script: str, record: str, now: datetime.datetime | None = None) -> Path:
    """Write `record` (a run's full markdown) to a new history file, and make it `script`'s latest result
    in `markdown_path`, replacing the one before. Returns the history file."""
    markdown_path = Path(markdown_path)
    text = markdown_path.read_text() if markdown_path.exists() else ""
    latest_span(text, script)  # a file whose markers are broken is refused before anything is written
    history = write_history(markdown_path.parent / HISTORY, script, record, now or datetime.datetime.now())
    link = history.relative_to(markdown_path.parent).as_posix()
    block = f"{latest_block(record)}\nFull record: [`{link}`]({link}).\n"
    markdown_path.write_text(replace_latest(text, script, block))
    return history


def write_history(folder: Path, script: str, record: str, when: datetime.datetime) -> Path:
    """A new file per run: two runs in the same minute get `-2`, `-3`... rather than overwriting each other."""
    folder.mkdir(parents=True, exist_ok=True)
    stem = f"{when:%Y-%m-%d-%H%M}-{result_key(script)}"
    for n in range(1, 1000):
        path = folder / (stem + ("" if n == 1 else f"-{n}") + ".md")
        try:
            with open(path, "x") as f:  # "x": never overwrite a record, even one written a moment ago
                f.write(record.strip("\n") + "\n")
            return path
        except FileExistsError:
            continue
    raise RuntimeError(f"no free history file name for {stem} in {folder}")


def latest_block(record: str) -> str:
    """The record with its headings moved so that its top one is `SECTION_LEVEL` (code blocks left alone)."""
    lines, fenced = record.strip("\n").splitlines(), False
    levels = []
    for line in lines:
        fenced ^= line.startswith("```")
        if not fenced and (m := re.match(r"(#{1,6}) ", line)):
            levels.append(len(m.group(1)))
    shift = SECTION_LEVEL - min(levels) if levels else 0
    out, fenced = [], False
    for line in lines:
        fenced ^= line.startswith("```")
        if not fenced and shift and re.match(r"#{1,6} ", line):
            line = "#" * min(6, line.index(" ") + shift) + line[line.index(" "):]
        out.append(line)
    return "\n".join(out) + "\n"


def latest_span(text: str, script: str) -> tuple[int, int] | None:
    """Where `script`'s latest result lies in `text` (after its begin marker, up to its end marker), or None."""
    begin, end = markers(script)
    start, stop = text.find(begin), text.find(end)
    if start < 0 and stop < 0:
        return None
    if start < 0 or stop < start or text.count(begin) > 1 or text.count(end) > 1:
        raise ValueError(f"{script}: unbalanced markers {begin} / {end}: fix the file by hand")
    return start + len(begin), stop


def replace_latest(text: str, script: str, block: str) -> str:
    """`text` with what lies between `script`'s markers replaced by `block`; without them, a new section at the end."""
    span = latest_span(text, script)
    if span is not None:
        return text[: span[0]] + "\n" + block + text[span[1] :]
    begin, end = markers(script)
    heading = f"## `scripts/{Path(script).stem}.py`"
    if result_key(script) != Path(script).stem:
        heading += f", playing an older CPU (`TANDEM_CPU_MAX_ISA={max_isa()}`)"
    return text.rstrip("\n") + ("\n\n" if text.strip() else "") + f"{heading}\n\n{begin}\n{block}{end}\n"
