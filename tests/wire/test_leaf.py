"""`wire` is a leaf: every process imports it, so it pulls in no torch and no other Tandem package."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import wire

TANDEM_PACKAGES = ("engine", "kvtransfer", "runtime", "router", "cluster", "prefill_worker", "decode_worker",
                   "output_text", "wire", "costmodel", "planner")  # fmt: skip
REPO = pathlib.Path(wire.__file__).parent.parent


def modules_of(package: str) -> list[str]:
    return sorted(f"{package}.{p.stem}" for p in (REPO / package).glob("*.py") if p.stem != "__init__")


def loaded_by(modules: list[str], packages: tuple[str, ...]) -> list[str]:
    """The modules of `packages` that importing `modules` loads, in a fresh interpreter."""
    script = (
        f"import json, sys\nfor m in {modules!r}: __import__(m)\n"
        f"print(json.dumps(sorted(n for n in sys.modules if n.split('.')[0] in {packages!r})))"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True, cwd=REPO)
    return json.loads(out.stdout)


def test_wire_imports_neither_torch_nor_another_tandem_package():
    modules = modules_of("wire")
    others = tuple(p for p in TANDEM_PACKAGES if p != "wire")
    assert loaded_by(modules, ("torch", *others)) == []
    assert len(modules) >= 8
