"""The kernels compile for an H100 with triton's real compiler (in a subprocess, no GPU needed)."""

import os
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).with_name("compile_for_h100.py")
REPO = SCRIPT.parents[3]


def test_kernels_compile_to_sm90_cubins(tmp_path):
    # A fresh cache dir so the kernels are really compiled, not read back from an earlier run.
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(TRITON_CACHE_DIR=str(tmp_path), PYTHONPATH=f"{REPO}{os.pathsep}{env.get('PYTHONPATH', '')}")
    proc = subprocess.run([sys.executable, str(SCRIPT), "bf16"], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count(": ok") == 5, proc.stdout
