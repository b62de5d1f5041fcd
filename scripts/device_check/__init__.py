"""The parts of scripts/gpu_check.py: one prepared check for whoever is lent a GPU.

Parent side: `plan` (the steps, their commands and time budgets), `runner` (one step in its own
process group, under its budget, its log in OUT_DIR), `bench_figures` (key figures from the
benchmarks' JSON), `report` (the table, summary.md, results.json, the exit status).
Step side, each run through `launch` (which honours `blocked_imports`): `real_size_model`,
`engine_parity`, `kv_engines` with its `kv_decode_peer`; they talk to the parent through
`step_io` (figure lines, the skip status). The kernel step is pytest on
tests/engine/kernels/test_kernels_on_device.py; the benchmark steps are scripts/bench_kernels.py
and scripts/bench_engine.py.
"""
