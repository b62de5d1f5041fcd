"""bench_kernel_choice's reading of the kernel choices it compares: which kernel a row count ran, per weight type."""

from __future__ import annotations

from scripts import bench_kernel_choice

OPS = ("native; linears by rows: 1 row: dense, 2-4 rows: dense, 5-16 rows: dense, 17-64 rows: dense, 65-256 rows: "
       "dense, 257+ rows: dense; elementwise by rows: rms_norm: native native native native native native; GGUF blocks "
       "by rows: Q4_1: 1 row: blocks, 2-4 rows: onednn, 5-16 rows: onednn, 17-64 rows: onednn, 65-256 rows: onednn, "
       "257+ rows: onednn; Q8_0: 1 row: blocks, 2-4 rows: blocks, 5-16 rows: onednn, 17-64 rows: onednn, 65-256 rows: "
       "onednn, 257+ rows: onednn")  # fmt: skip


def test_the_kernels_a_row_count_ran_are_read_per_weight_type():
    choice = bench_kernel_choice.gguf_choice(OPS)
    assert choice.startswith("Q4_1: 1 row: blocks")
    assert bench_kernel_choice.kernels_at(choice, 1) == "Q4_1: blocks; Q8_0: blocks"
    assert bench_kernel_choice.kernels_at(choice, 3) == "Q4_1: onednn; Q8_0: blocks"
    assert bench_kernel_choice.kernels_at(choice, 16) == "Q4_1: onednn; Q8_0: onednn"


def test_each_row_count_keeps_its_best_run():
    runs = [{"ops": "a", "ms": {"1": 5.0, "8": 14.0}}, {"ops": "a", "ms": {"1": 6.0, "8": 13.0}}]
    assert bench_kernel_choice.best_of(runs) == {"ops": "a", "ms": {"1": 5.0, "8": 13.0}}
