"""The kernels an AVX2-only CPU runs, built and checked on this one.

`TANDEM_CPU_MAX_ISA=avx2` builds the native kernels without AVX-512 (the portable vector paths of
packed linear and prefill attention, no bf16 dot products), and the kernels' own parity tests must
pass on that build as they do on the default one."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from engine.cpu_features import read_cpuinfo
from engine.native.loader import native_kernels_enabled

KERNEL_TESTS = ["tests/engine/test_cpu_attention.py", "tests/engine/test_cpu_prefill_attention.py",
                "tests/engine/test_layer_ops.py", "tests/engine/test_prepared_linear.py"]  # fmt: skip
ROOT = Path(__file__).resolve().parents[2]
BUILD_S = 900  # a cold build of the kernels takes minutes on 2 cores

pytestmark = [
    pytest.mark.skipif("avx512f" not in read_cpuinfo().flags, reason="no AVX-512 here: the default build is the AVX2 one"),
    pytest.mark.skipif(not native_kernels_enabled(), reason="native kernels turned off (TANDEM_CPU_KERNELS=0)"),
    pytest.mark.timeout(BUILD_S + 300),
]


def capped_run(*args: str, timeout_s: float) -> subprocess.CompletedProcess:
    env = {**os.environ, "TANDEM_CPU_MAX_ISA": "avx2"}
    return subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout_s)


def test_the_avx2_build_has_no_avx512_and_passes_the_kernel_tests():
    built = capped_run("-c", "from engine.native import load_cpu_kernels as k; print(*k().built_with())", timeout_s=BUILD_S)
    assert built.returncode == 0, built.stderr[-3000:]
    assert set(built.stdout.split()) == {"avx2", "fma"}
    tests = capped_run("-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=", "-rs", *KERNEL_TESTS,
                       timeout_s=300)  # fmt: skip
    assert tests.returncode == 0, tests.stdout[-5000:]
    assert "skipped" not in tests.stdout.splitlines()[-1], tests.stdout[-2000:]  # every kernel test ran on it
