"""`costmodel` is a leaf the router may evaluate per request: no torch, no other Tandem package."""

from __future__ import annotations

from tests.wire.test_leaf import TANDEM_PACKAGES, loaded_by, modules_of


def test_costmodel_imports_neither_torch_nor_another_tandem_package():
    modules = modules_of("costmodel")
    others = tuple(p for p in TANDEM_PACKAGES if p != "costmodel")
    assert loaded_by(modules, ("torch", *others)) == []
    assert len(modules) >= 6


def test_the_router_never_imports_the_planner():
    assert loaded_by(["router.app", "router.dispatch"], ("planner",)) == []
