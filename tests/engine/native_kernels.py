"""The native CPU kernels for the tests that need them.

A skip only where they cannot be built: turned off (TANDEM_CPU_KERNELS=0) or no C++ compiler, said in the
test output. Where a compiler is here and the build failed, the test fails: a broken native build must not
pass CI as a row of skips.
"""

from __future__ import annotations

import os
import shutil

import pytest

from engine.native import load_cpu_kernels
from engine.native.loader import native_kernels_enabled


def why_no_kernels() -> str | None:
    """Why the kernels may rightly be missing here (a skip's reason); None: they should have been built."""
    if not native_kernels_enabled():
        return "native CPU kernels turned off (TANDEM_CPU_KERNELS=0)"
    compiler = os.environ.get("CXX", "c++")  # what torch.utils.cpp_extension builds with
    if shutil.which(compiler) is None:
        return f"no C++ compiler here ({compiler!r} not found): the native CPU kernels cannot be built"
    return None


def native_kernels(module_level: bool = False):
    """The built kernels; skips (said why) where they cannot be built, fails where they should have been."""
    kernels = load_cpu_kernels()
    if kernels is not None:
        return kernels
    reason = why_no_kernels()
    if reason is not None:
        pytest.skip(reason, allow_module_level=module_level)
    pytest.fail("the native CPU kernels failed to build on a machine with a C++ compiler (the warning of "
                "engine.native.loader says why)", pytrace=False)  # fmt: skip


def native_kernels_or_none():
    """For a module some of whose tests run without the kernels: None only where they cannot be built here
    (mark the tests that need them); a broken build fails the module's collection."""
    kernels = load_cpu_kernels()
    if kernels is None and why_no_kernels() is None:
        raise RuntimeError("the native CPU kernels failed to build on a machine with a C++ compiler "
                           "(the warning of engine.native.loader says why)")  # fmt: skip
    return kernels
