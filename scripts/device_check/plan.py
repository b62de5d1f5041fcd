"""The check's steps, in order: what each runs, in which environment, under which time budget.

On the GPU (about 8 minutes in all on one H100 or H200) the kernels run compiled in bfloat16 and
float16, the engine on CUDA in float32 and bfloat16, the benchmarks at their real sizes. A dry run
runs the same steps on the CPU: Triton's interpreter in float32 only, tiny models, the smallest
benchmark sizes; it proves the check works, its figures mean nothing.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from .bench_figures import engine_figures, kernel_figures, test_figures
from .launch import command
from .runner import Step, StepResult, skipped

ORDER = ("kernels", "model", "engine", "bench_kernels", "bench_engine", "profile", "step_trace", "graph_probe",
         "kv_transfer")  # fmt: skip
TOTAL_S = 480  # the whole check: 8 of a lent GPU's 15 minutes, the machine's start and a rerun beside it
# Seconds each step may take at most; the real runs should need about half.
BUDGET_S = {"kernels": 150, "model": 90, "engine": 180, "bench_kernels": 90, "bench_engine": 150, "profile": 120,
            "step_trace": 90, "graph_probe": 60, "kv_transfer": 90}  # fmt: skip
NEEDS_MODEL = ("engine", "bench_engine", "profile", "step_trace", "graph_probe")
PROFILE_FILE = "profile.json"  # the measured profile, in OUT_DIR: what `tandem plan --profile` takes
PROFILE_SAMPLES_FILE = "profile.samples.json"  # its measured steps, beside it (device_profile.py)
NO_MODEL = "no real-size model: the model step did not make one"


@dataclass(frozen=True)
class Settings:
    work: Path  # scratch: models, the benchmarks' JSON and records
    out: Path  # what comes back from the GPU machine: the summary, the logs, the measured profile
    dry_run: bool
    default_model: str | None

    @property
    def device(self) -> str:
        return "cpu" if self.dry_run else "cuda"

    def env(self) -> dict[str, str]:
        """Compiled Triton on the GPU; the interpreter on CPU, with PyTorch's own CPU ops (no native build)."""
        if self.dry_run:
            return {"TRITON_INTERPRET": "1", "TANDEM_CPU_KERNELS": "0"}
        return {"TRITON_INTERPRET": "0"}


def _model_dir(done: dict[str, StepResult]) -> str | None:
    """The real-size model's directory, as the model step said it (None: it made none)."""
    return done["model"].figures.get("model_dir") if "model" in done else None


def kernels(s: Settings, done: dict[str, StepResult]) -> Step:
    env = {"TANDEM_KERNEL_DEVICE": s.device, "TANDEM_KERNEL_DTYPES": "float32" if s.dry_run else "bfloat16,float16"}
    test, junit = "tests/engine/kernels/test_kernels_on_device.py", s.work / "kernels.xml"
    # `-o addopts=`: one file, in one process; the GPU image may lack pytest-xdist, which addopts asks for
    argv = command("pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=", f"--junitxml={junit}", test)
    return Step("kernels", argv, BUDGET_S["kernels"], env, read_figures=lambda: test_figures(junit))


def model(s: Settings, done: dict[str, StepResult]) -> Step:
    args = ["--work", str(s.work)] + (["--default-model", s.default_model] if s.default_model else [])
    args += ["--dry-run"] if s.dry_run else []
    return Step("model", command("device_check.real_size_model", *args), BUDGET_S["model"])


def engine(s: Settings, done: dict[str, StepResult]) -> Step:
    args = ["--device", s.device, "--dtypes", "float32" if s.dry_run else "float32,bfloat16", "--work", str(s.work)]
    args += ["--max-new", "8"] if s.dry_run else []  # Triton's interpreter runs the steps: a few show the paths
    figures = done["model"].figures if "model" in done else {}
    if "model_dir" in figures:
        args += ["--model-dir", figures["model_dir"], "--model-label", figures["model"]]
    return Step("engine", command("device_check.engine_parity", *args), BUDGET_S["engine"])


def bench_kernels(s: Settings, done: dict[str, StepResult]) -> Step:
    out = s.work / "bench_kernels.json"
    args = ["--device", s.device, "--json", str(out), "--markdown", str(s.work / "BENCHMARKS.md")]
    args += ["--smoke", "--reps", "1"] if s.dry_run else []
    return Step("bench_kernels", command("scripts/bench_kernels.py", *args), BUDGET_S["bench_kernels"],
                read_figures=lambda: kernel_figures(out))  # fmt: skip


def bench_engine(s: Settings, done: dict[str, StepResult]) -> Step | StepResult:
    model_dir = _model_dir(done)
    if model_dir is None:
        return skipped("bench_engine", NO_MODEL)
    out = s.work / "bench_engine.json"
    args = ["--device", s.device, "--model", model_dir, "--json", str(out),
            "--markdown", str(s.work / "BENCHMARKS.md")]  # fmt: skip
    if s.dry_run:
        args += ["--dtype", "float32", "--num-requests", "4", "--hf-batch-size", "4", "--output-len-scale", "0.05",
                 "--kv-cache-gib", "1"]  # fmt: skip
    else:
        args += ["--dtype", "bfloat16"]
    return Step("bench_engine", command("scripts/bench_engine.py", *args), BUDGET_S["bench_engine"],
                read_figures=lambda: engine_figures(out))  # fmt: skip


def profile(s: Settings, done: dict[str, StepResult]) -> Step | StepResult:
    model_dir = _model_dir(done)
    if model_dir is None:
        return skipped("profile", NO_MODEL)
    args = ["--device", s.device, "--model-dir", model_dir, "--out", str(s.out / PROFILE_FILE)]
    args += ["--dry-run", "--published", "h200"] if s.dry_run else []  # a dry run compares to figures all the same
    return Step("profile", command("device_check.device_profile", *args), BUDGET_S["profile"])


def step_trace(s: Settings, done: dict[str, StepResult]) -> Step | StepResult:
    model_dir = _model_dir(done)
    if model_dir is None:
        return skipped("step_trace", NO_MODEL)
    args = ["--device", s.device, "--model-dir", model_dir]
    args += ["--dry-run", "--rows", "1,4"] if s.dry_run else ["--rows", "1,64"]
    return Step("step_trace", command("device_check.step_trace", *args), BUDGET_S["step_trace"])


def graph_probe(s: Settings, done: dict[str, StepResult]) -> Step | StepResult:
    model_dir = _model_dir(done)
    if model_dir is None:
        return skipped("graph_probe", NO_MODEL)
    args = ["--device", s.device, "--model-dir", model_dir, "--rows", "1,4" if s.dry_run else "1,64"]
    return Step("graph_probe", command("device_check.graph_probe", *args), BUDGET_S["graph_probe"])


def kv_transfer(s: Settings, done: dict[str, StepResult]) -> Step:
    args = ["--device", s.device, "--work", str(s.work)]
    return Step("kv_transfer", command("device_check.kv_engines", *args), BUDGET_S["kv_transfer"])


FACTORIES = {f.__name__: f for f in (kernels, model, engine, bench_kernels, bench_engine, profile, step_trace,
                                     graph_probe, kv_transfer)}


def selected(only: str | None) -> list[str]:
    """The steps to run, in ORDER; the model step comes along with a step that needs it."""
    if not only:
        return list(ORDER)
    names = set(re.split(r"[,\s]+", only.strip()))
    unknown = names - set(ORDER)
    if unknown:
        raise ValueError(f"unknown step(s) {', '.join(sorted(unknown))}; the steps: {', '.join(ORDER)}")
    if names & set(NEEDS_MODEL):
        names.add("model")
    return [name for name in ORDER if name in names]
