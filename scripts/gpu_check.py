"""One prepared GPU check: the Triton kernels, the engine on CUDA and a real-size benchmark, in one call.

    python3 scripts/gpu_check.py OUT_DIR                      # on the lent GPU: about 5 of its 8 minutes
    python3 scripts/gpu_check.py --dry-run OUT_DIR            # here, on the CPU (the test suite runs this)
    python3 scripts/gpu_check.py --default-model DIR OUT_DIR  # with SmolLM2-135M-Instruct converted (below)
    python3 scripts/gpu_check.py --only kernels,engine OUT_DIR

Run it from the repository root with the machine's own Python: nothing is installed, every step finds
the repository on PYTHONPATH. The GPU image has PyTorch, Triton, transformers, msgpack, numpy,
safetensors and pytest, and lacks Ray, pyzmq, FastAPI, xgrammar and gguf; no step needs them but the
KV step, which needs pyzmq (carry its wheel: scripts/gpu_check_wheels.txt) and is skipped without it.
`--without ray,zmq,...` makes those packages unimportable in every step, to prove that here.

Steps, each in its own process group under its own time budget (device_check/plan.py), 8 minutes in all:

  kernels        tests/engine/kernels/test_kernels_on_device.py: cache write, paged decode (with
                 flash-decoding splits) and prefill attention compiled, bf16 and fp16, against the
                 float32 PyTorch references
  model          SmolLM2-135M-Instruct from --default-model or its GGUF; else (always on the lent GPU,
                 see below) the step is skipped and its shape with random weights stands in
  engine         engine.LLM on CUDA against transformers' greedy generate: tiny Llama and Qwen3, then
                 the real-size model; float32 token for token, bf16 up to a near tie
  bench_kernels  scripts/bench_kernels.py: decode attention as a share of HBM bandwidth, prefill TFLOP/s
  bench_engine   scripts/bench_engine.py --device cuda: both workloads, Tandem against transformers
  profile        `tandem profile`'s grid of engine steps on CUDA, fitted (OUT_DIR/profile.json, what
                 `tandem plan --profile` takes), and the published-figures profile's error on those steps
  step_trace     where a decode step's time goes (torch.profiler): the device's busy share of the step's
                 wall time, and the host operators that take the most
  graph_probe    the model's decode forward captured as one CUDA graph and replayed, against eager: what
                 graphs would buy, and whether the forward still allows them
  kv_transfer    two engines in two processes on the one GPU: KV over ZMQ IPC and TCP, bit-identical
                 blocks and the same tokens (NCCL needs two GPUs, gloo CPU tensors: said, not run)

OUT_DIR gets summary.md (the table of steps, key figures, the benchmarks' records), results.json,
steps.log (every step's output in order), profile.json and profile.samples.json: five files, under
the eight the device tool sends back. The exit status is 1 when a
step failed; a skipped step says why. Where the results go: docs/engine.md, "GPU check".

The default model: its GGUF is 94 MiB and its converted directory 513 MiB (float32), both over the
64 MiB a device call carries, and the image has no network, so on the lent GPU the stand-in runs
instead. On a GPU machine where the model can be put, convert it on any machine with Tandem's venv
(`python -c "from engine.model_source import resolve_model; print(resolve_model(None))"` prints the
converted directory under ~/.cache/tandem/gguf/) and pass that directory as --default-model.
"""

from __future__ import annotations

import argparse
import os
import platform
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from device_check import plan, report
from device_check.blocked_imports import ENV as WITHOUT_ENV
from device_check.runner import STEPS_LOG, StepResult, child_env, run_step

REPO = Path(__file__).resolve().parents[1]


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out_dir", help="summary.md, results.json, steps.log and profile.json go here")
    p.add_argument("--dry-run", action="store_true", help="the same steps on the CPU, smallest sizes")
    p.add_argument("--default-model", default=None, metavar="DIR", help="SmolLM2-135M-Instruct, converted")
    p.add_argument("--only", default=None, help=f"comma-separated steps of: {', '.join(plan.ORDER)}")
    p.add_argument("--without", default="", help="packages no step may import (as on the GPU image)")
    p.add_argument("--work", default=None, help="scratch for models and raw results (default: a new temp dir)")
    p.add_argument("--total-s", type=float, default=plan.TOTAL_S, help="the whole check's time")
    args = p.parse_args(argv)
    try:
        args.steps = plan.selected(args.only)
    except ValueError as err:
        p.error(str(err))
    return args


def run(args, out_dir: Path, work: Path) -> list[StepResult]:
    """Every selected step in order, each seeing the results before it (the model step's directory)."""
    default_model = str(Path(args.default_model).resolve()) if args.default_model else None
    settings = plan.Settings(work, out_dir, args.dry_run, default_model)
    env = child_env(REPO, {**settings.env(), WITHOUT_ENV: args.without})
    deadline = time.monotonic() + args.total_s
    done: dict[str, StepResult] = {}
    for name in args.steps:
        step = plan.FACTORIES[name](settings, done)
        done[name] = step if isinstance(step, StepResult) else run_step(step, out_dir, deadline, env)
    return list(done.values())


def header(args) -> list[str]:
    mode = "dry run on the CPU (figures mean nothing)" if args.dry_run else "on the GPU"
    lines = [
        f"Mode: {mode}; steps: {', '.join(args.steps)}",
        f"Machine: {_gpu_name()}, Python {platform.python_version()}",
        f"Commit: {_commit()}",
        f"Command: `python3 scripts/gpu_check.py {shlex.join(sys.argv[1:])}`",
    ]
    if args.without:
        lines.append(f"Blocked imports: {args.without}")
    return lines


def records(work: Path) -> dict[str, str]:
    """The benchmarks' own markdown records (what BENCHMARKS.md takes), by file name."""
    history = work / "benchmarks" / "history"
    return {path.name: path.read_text() for path in sorted(history.glob("*.md"))} if history.is_dir() else {}


def _gpu_name() -> str:
    try:
        query = ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"]
        out = subprocess.run(query, capture_output=True, text=True)
        return out.stdout.strip().replace("\n", ", ") or "no GPU"
    except OSError:
        return "no GPU (no nvidia-smi)"


def _commit() -> str:
    """HEAD, and whether the tracked files differ from it (the device tool sends the working tree)."""
    git = ["git", "-C", str(REPO)]
    try:
        head = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
        dirty = subprocess.run([*git, "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True)
    except OSError:
        return "unknown (no git)"
    if not head:
        return "unknown (not a git checkout)"
    return f"{head} + uncommitted changes" if dirty.stdout.strip() else head


def main(argv=None) -> int:
    args = parse_args(argv)
    out_dir = Path(args.out_dir).resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    work = Path(args.work).resolve() if args.work else Path(tempfile.mkdtemp(prefix="tandem-gpu-check-"))
    work.mkdir(parents=True, exist_ok=True)
    os.chdir(REPO)  # the steps name scripts and tests by paths from the repository root
    if not args.dry_run and _gpu_name().startswith("no GPU"):
        print("no GPU found (nvidia-smi): the CUDA steps will fail; --dry-run runs them on the CPU", flush=True)
    for earlier in (STEPS_LOG, plan.PROFILE_FILE, plan.PROFILE_SAMPLES_FILE):
        (out_dir / earlier).unlink(missing_ok=True)  # an earlier check's, in the same folder
    results = run(args, out_dir, work)
    lines, recs = header(args), records(work)
    text = report.summary("GPU check", lines, results, recs)
    report.write(out_dir, text, results, lines, recs)
    print("\n" + report.table(results) + "\n\n" + "\n".join(report.figure_lines(results)))
    print(f"\nsummary: {out_dir / 'summary.md'}; the steps' output: {out_dir / STEPS_LOG}")
    return report.exit_status(results)


if __name__ == "__main__":
    sys.exit(main())
