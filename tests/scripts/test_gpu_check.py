"""scripts/gpu_check.py: its dry run passes on the CPU without the packages the GPU image lacks; its
KV step moves an engine's KV between two processes; a step that hangs is killed with its children."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from scripts.device_check import plan
from scripts.device_check.report import exit_status
from scripts.device_check.runner import Step, run_step

REPO = Path(__file__).resolve().parents[2]
# Absent from the GPU image (docs/engine.md, "GPU check"): no step may need them.
NOT_ON_THE_IMAGE = "ray,zmq,fastapi,uvicorn,pydantic,xgrammar,gguf"


def _check(out: Path, *args: str, timeout: int = 600) -> tuple[subprocess.CompletedProcess, dict]:
    argv = [sys.executable, "scripts/gpu_check.py", "--dry-run", "--work", str(out / "work"), *args, str(out / "out")]
    proc = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=timeout)
    results = json.loads((out / "out" / "results.json").read_text())
    return proc, {step["name"]: step for step in results["steps"]}


def test_dry_run_passes_with_the_packages_the_gpu_image_lacks_blocked(tmp_path):
    # zmq is here, so the KV step's skip below proves that the blocking works in the steps' processes.
    assert importlib.util.find_spec("zmq") is not None
    proc, steps = _check(tmp_path, "--without", NOT_ON_THE_IMAGE)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert {name: step["status"] for name, step in steps.items()} == {
        "kernels": "passed", "model": "skipped", "engine": "passed",
        "bench_kernels": "passed", "bench_engine": "passed", "profile": "passed",
        "step_trace": "passed", "graph_probe": "passed", "kv_transfer": "skipped",
    }, proc.stdout  # fmt: skip
    assert "pyzmq is not importable" in steps["kv_transfer"]["reason"]
    assert "dry run" in steps["model"]["reason"] and "stands in" in steps["model"]["reason"]
    assert steps["kernels"]["figures"]["cases"].startswith("14 of 14 passed")
    parity = [v for k, v in steps["engine"]["figures"].items() if "tokens agreeing" in k]
    assert parity == ["40/40"] * 3  # tiny Llama, tiny Qwen3, SmolLM2's shape
    assert "tandem" in steps["bench_engine"]["figures"]["workload b"]
    assert "decode 4x256" in steps["bench_kernels"]["figures"]
    profile = steps["profile"]["figures"]
    assert "fit median" in profile["profile"] and "KV transfer" in profile  # pyzmq blocked: the figure stands in
    assert {"decode steps", "prefill steps", "mixed steps"} <= {k.split(" (")[0] for k in profile}, profile
    assert "published" in profile["term fixed_s"]
    measured = json.loads((tmp_path / "out" / plan.PROFILE_FILE).read_text())
    assert measured["source"] == "measured" and measured["fit"]["points"] > 10
    trace = steps["step_trace"]["figures"]
    assert "device busy" in trace["decode 4 rows"] and "calls/step" in trace["decode 4 rows, host: aten::mm"]
    probe = steps["graph_probe"]["figures"]
    assert probe["decode 4 rows, eager forward"].endswith(" ms") and "need a GPU" in probe["decode 4 rows, graph"]
    files = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert files == sorted(["summary.md", "results.json", "steps.log", plan.PROFILE_FILE, plan.PROFILE_SAMPLES_FILE])
    assert all(f"==== {name} ====" in (tmp_path / "out" / "steps.log").read_text() for name in plan.ORDER)
    summary = (tmp_path / "out" / "summary.md").read_text()
    assert "| kv_transfer | skipped |" in summary and "Record" in summary


def test_kv_step_moves_an_engines_kv_into_another_process_and_decodes_the_same(tmp_path):
    proc, steps = _check(tmp_path, "--only", "kv_transfer")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    kv = steps["kv_transfer"]
    assert kv["status"] == "passed", kv
    assert kv["figures"]["zmq-ipc"].startswith("3 of 3 blocks")
    tcp = kv["figures"]["zmq-tcp"]  # the second prompt shares two blocks with the first: decode keeps those
    assert tcp.startswith("1 of 3 blocks") and "2 kept from decode's prefix cache" in tcp


def _python(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def test_a_step_past_its_budget_is_killed_with_the_processes_it_started(tmp_path):
    pid_file = tmp_path / "child.pid"
    code = (
        "import subprocess, sys, time\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        f"open({str(pid_file)!r}, 'w').write(str(child.pid))\n"
        "time.sleep(60)"
    )
    start = time.monotonic()
    result = run_step(Step("hang", _python(code), budget_s=2), tmp_path, time.monotonic() + 100, dict(os.environ))
    assert time.monotonic() - start < 10
    assert result.status == "failed" and result.reason.startswith("timed out after 2 s")
    assert result.log == "steps.log" and "==== hang ====" in (tmp_path / "steps.log").read_text()
    assert not (tmp_path / "hang.log").exists()
    child = int(pid_file.read_text())
    for _ in range(50):  # the killed child is reaped by whoever adopted it
        if not Path(f"/proc/{child}").exists() or "Z" in Path(f"/proc/{child}/stat").read_text().split()[2]:
            break
        time.sleep(0.1)
    else:
        pytest.fail("the step's child outlived its budget")


def test_step_status_figures_and_reasons_come_from_its_output(tmp_path):
    env, deadline = dict(os.environ), time.monotonic() + 100
    skip = run_step(Step("s", _python("print('figure: x = 1'); print('skip: no GPU here'); raise SystemExit(77)"), 30),
                    tmp_path, deadline, env)  # fmt: skip
    fail = run_step(Step("f", _python("print('boom'); raise SystemExit(3)"), 30), tmp_path, deadline, env)
    ok = run_step(Step("p", _python("print('figure: y = 2')"), 30, read_figures=lambda: {"z": "3"}),
                  tmp_path, deadline, env)  # fmt: skip
    assert (skip.status, skip.reason, skip.figures) == ("skipped", "no GPU here", {"x": "1"})
    assert (fail.status, fail.reason) == ("failed", "exit status 3: boom")
    assert (ok.status, ok.figures) == ("passed", {"y": "2", "z": "3"})
    assert exit_status([skip, ok]) == 0 and exit_status([skip, ok, fail]) == 1
    late = run_step(Step("late", _python("pass"), 30), tmp_path, time.monotonic() + 5, env)
    assert late.status == "skipped" and "not started" in late.reason


def test_only_brings_the_model_step_along_and_refuses_unknown_steps():
    assert plan.selected("bench_engine") == ["model", "bench_engine"]
    assert plan.selected("profile") == ["model", "profile"]
    assert plan.selected("kv_transfer,kernels") == ["kernels", "kv_transfer"]
    assert plan.selected(None) == list(plan.ORDER)
    with pytest.raises(ValueError, match="unknown step"):
        plan.selected("kernel")
