"""Choosing a linear kernel per band of row counts by timing (engine.layers.linear_choice): fake kernels whose
cost the test decides, and the cache that makes the first start on a machine the only one that times."""

from __future__ import annotations

import pytest
import torch

from engine.layers.linear_choice import BANDS, Candidate, band_of, cached_choice, choose
from tests.engine.native_kernels import native_kernels


def _cost_timer(costs):
    """A timer that runs the call and reports `costs(name, rows)` as its time."""

    def timer(call):
        return sum(call())  # a layer's linears, one after the other

    def kernel(name):
        return lambda x, weight, bias: costs(name, x.shape[0])

    return timer, kernel


def test_the_fastest_kernel_that_takes_the_whole_band_wins_each_band():
    # "gemv" is cheapest for one row, "few" for up to 16 rows (its limit), "gemm" otherwise.
    table = {"gemv": lambda rows: 1, "few": lambda rows: 2 if rows <= 16 else 99, "gemm": lambda rows: 3}
    timer, kernel = _cost_timer(lambda name, rows: table[name](rows))
    candidates = [Candidate("gemv", "dense", kernel("gemv"), max_rows=1), Candidate("few", "dense", kernel("few"),
                  max_rows=16), Candidate("gemm", "dense", kernel("gemm"))]  # fmt: skip
    choice = choose(candidates, [(8, 4), (6, 4)], torch.float32, {"dense": lambda w: w}, timer)
    assert choice == ("gemv", "few", "few", "gemm", "gemm", "gemm")
    assert [band_of(rows) for rows in (0, 1, 2, 4, 5, 16, 17, 64, 65, 256, 257, 10**6)] == [5, 0, 1, 1, 2, 2, 3, 3, 4,
                                                                                            4, 5, 5]  # fmt: skip


def test_the_choice_is_timed_once_per_key_and_cached(tmp_path, monkeypatch):
    monkeypatch.setenv("TANDEM_CACHE_DIR", str(tmp_path))
    calls = []

    def compute():
        calls.append(1)
        return ("a",) * len(BANDS)

    assert cached_choice(["cpu x", "threads 1"], compute) == ("a",) * len(BANDS)
    assert cached_choice(["cpu x", "threads 1"], compute) == ("a",) * len(BANDS)
    assert len(calls) == 1  # the second start read it
    cached_choice(["cpu x", "threads 2"], compute)  # other threads, another machine: timed again
    assert len(calls) == 2
    (tmp_path / "kernel-choice").chmod(0o500)  # nowhere to write: timed, and still answered
    try:
        assert cached_choice(["cpu y"], compute) == ("a",) * len(BANDS) and len(calls) == 3
    finally:
        (tmp_path / "kernel-choice").chmod(0o700)


def test_a_damaged_cache_entry_is_timed_again(tmp_path, monkeypatch):
    monkeypatch.setenv("TANDEM_CACHE_DIR", str(tmp_path))
    cached_choice(["k"], lambda: ("a",) * len(BANDS))
    (entry,) = (tmp_path / "kernel-choice").glob("*.json")
    entry.write_text("{not json")
    assert cached_choice(["k"], lambda: ("b",) * len(BANDS)) == ("b",) * len(BANDS)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_real_kernels_are_timed_on_the_models_shapes(dtype, tmp_path, monkeypatch):
    from engine.layers.ops import chosen_linear
    kernels = native_kernels()
    monkeypatch.setenv("TANDEM_CACHE_DIR", str(tmp_path))
    linear, prepare, described = chosen_linear(kernels, dtype, [(48, 32), (32, 48)])
    assert described.count(": ") == len(BANDS)  # a kernel named for every band
    x, w = torch.randn(7, 32).to(dtype), torch.randn(48, 32).to(dtype)
    tol = dict(atol=1e-4, rtol=1e-4) if dtype == torch.float32 else dict(atol=0.1, rtol=2e-2)
    torch.testing.assert_close(linear(x, prepare(w)), torch.nn.functional.linear(x, w), **tol)
