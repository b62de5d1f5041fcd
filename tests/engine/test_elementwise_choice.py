"""Each elementwise op runs the implementation timed fastest for its band of row counts
(engine.layers.elementwise_choice), and what runs is the same arithmetic either way."""

from __future__ import annotations

import pytest
import torch

from engine.layers import ops
from engine.layers.elementwise_choice import BANDS, OPS, OpShapes, choose_elementwise, dispatched, op_inputs
from tests.engine.native_kernels import native_kernels

SHAPES = OpShapes(hidden=48, intermediate=64, heads=3, head_dim=16)


def _recording(name: str, calls: list):
    def op(x, *args):
        calls.append((name, x.shape[0]))

    return {op_name: op for op_name in OPS}


def test_the_faster_implementation_is_chosen_per_op_and_band_and_dispatched_by_rows():
    calls = []
    impls = {"native": _recording("native", calls), "torch": _recording("torch", calls)}

    def timer(fn):  # native is faster on few rows, torch on many, whatever the op
        calls.clear()
        fn()
        name, rows = calls[0]
        return rows if name == "native" else 40

    choice = choose_elementwise(impls, SHAPES, torch.float32, timer)
    assert len(choice) == len(BANDS)
    assert choice[0] == "rms_norm=native,add_rms_norm=native,rotary=native,silu_and_mul=native"
    assert choice[-1] == "rms_norm=torch,add_rms_norm=torch,rotary=torch,silu_and_mul=torch"
    run = dispatched(impls, choice)
    calls.clear()
    for rows in (1, 3, 300):
        run["silu_and_mul"](torch.zeros(rows, 2))
    assert calls == [("native", 1), ("native", 3), ("torch", 300)]
    assert dispatched(impls, (choice[0],) * len(BANDS))["rms_norm"] is impls["native"]["rms_norm"]  # no dispatch


def test_op_inputs_fit_the_reference_ops():
    args = op_inputs(SHAPES, 5, torch.float32)
    assert ops.torch_silu_and_mul(*args["silu_and_mul"]).shape == (5, SHAPES.intermediate)
    assert ops.torch_rotary(*args["rotary"]).shape == (5, SHAPES.heads, SHAPES.head_dim)
    assert ops.torch_add_rms_norm(*args["add_rms_norm"])[0].shape == (5, SHAPES.hidden)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_timed_ops_on_this_machine_agree_with_the_reference(dtype, tmp_path, monkeypatch):
    monkeypatch.setenv("TANDEM_CACHE_DIR", str(tmp_path))  # time here, not a cached answer
    chosen = ops.native_ops(native_kernels(), dtype, [(24, 40)], op_shapes=SHAPES)
    assert "elementwise by rows: rms_norm:" in chosen.name
    tol = dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=1e-2, rtol=1e-2)
    for rows in (1, 40, 300):
        args = op_inputs(SHAPES, rows, dtype)
        torch.testing.assert_close(chosen.silu_and_mul(*args["silu_and_mul"]),
                                   ops.TORCH_OPS.silu_and_mul(*args["silu_and_mul"]), **tol)  # fmt: skip
        torch.testing.assert_close(chosen.rms_norm(*args["rms_norm"]), ops.TORCH_OPS.rms_norm(*args["rms_norm"]), **tol)
        heads, n, cos, sin = args["rotary"]
        torch.testing.assert_close(chosen.rotary(heads.clone(), n, cos, sin), ops.TORCH_OPS.rotary(heads, n, cos, sin),
                                   **tol)  # fmt: skip
