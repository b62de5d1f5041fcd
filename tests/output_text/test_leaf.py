"""`output_text` is a leaf the router and the engine both import: no torch, no other Tandem package."""

from __future__ import annotations

from tests.wire.test_leaf import TANDEM_PACKAGES, loaded_by, modules_of


def test_output_text_imports_neither_torch_nor_another_tandem_package():
    modules = modules_of("output_text")
    others = tuple(p for p in TANDEM_PACKAGES if p not in ("output_text", "wire"))
    assert loaded_by(modules, ("torch", *others)) == []
    assert len(modules) >= 3


def test_the_router_makes_text_without_the_engine():
    assert loaded_by(["router.app", "router.serving"], ("torch", "engine", "runtime")) == []
