"""Start a step's program with the packages of TANDEM_CHECK_WITHOUT blocked (device_check.blocked_imports).

    python -m device_check.launch pytest [ARGS...]            pytest.main(ARGS)
    python -m device_check.launch scripts/bench_kernels.py ... a script, as `python SCRIPT ...`
    python -m device_check.launch device_check.engine_parity  a module, as `python -m MODULE ...`

The parent puts the repository root and scripts/ on PYTHONPATH (nothing is installed on the GPU
machine); a step that starts a process of its own starts it with `command` too.
"""

from __future__ import annotations

import runpy
import sys

from .blocked_imports import install_from_env


def command(target: str, *args: str) -> list[str]:
    """The argv that runs `target` through this launcher with this interpreter."""
    return [sys.executable, "-m", "device_check.launch", target, *args]


def main(argv: list[str]) -> None:
    install_from_env()
    target, args = argv[0], argv[1:]
    sys.argv = [target, *args]
    if target == "pytest":
        import pytest

        sys.exit(pytest.main(args))
    if target.endswith(".py"):
        runpy.run_path(target, run_name="__main__")
    else:
        runpy.run_module(target, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main(sys.argv[1:])
