"""Where one engine step's time goes on this device: the host (Python, kernel launches) against the device.

    python -m device_check.launch device_check.step_trace --device cuda --model-dir DIR [--rows 1,64] [--dry-run]

For a batch of each size in `--rows` decode rows (64-token prompts, prefilled first): the step's wall time
(`LLMEngine.step`, the device synchronized before and after), the device's busy time in it (the sum of its
kernels' and copies' times in torch.profiler) and how many it ran, then the host's operators that take the
most time of their own. A step whose device is busy a small share of its wall time is bound by the host:
CUDA graphs or fewer, larger kernels are the cure, not faster kernels. A dry run traces the CPU alone.
"""

from __future__ import annotations

import argparse
import gc
import time

import torch

from .step_io import figure

TIMED_STEPS = 10
TRACED_STEPS = 3
TOP_HOST_OPS = 6
KV_BYTES = 1 << 30


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def decoding_engine(model_dir: str, device: str, dtype: str, rows: int):
    """An engine with `rows` requests past their prefill, each with room for many decode steps."""
    from engine.llm_engine import EngineArgs, LLMEngine
    from engine.sampling_params import SamplingParams

    # A set KV budget: a budget from the device's free memory would find the last batch size's engine there.
    args = EngineArgs(model=model_dir, dtype=dtype, device=device, max_model_len=1024, kv_cache_memory=KV_BYTES)
    engine = LLMEngine.from_args(args, skip_tokenizer_init=True, show_progress=False)
    engine.warm_up()
    params = SamplingParams(temperature=0.0, max_tokens=512, ignore_eos=True)
    for i in range(rows):
        engine.add_request(f"trace-{i}", {"prompt_token_ids": [100 + (i * 7 + j) % 900 for j in range(64)]}, params)
    while not all(r.output_token_ids for r in engine.requests.values()):
        engine.step()
    for _ in range(3):  # each shape's first steps pay one-time costs (Triton compiles, allocator growth)
        engine.step()
    return engine


def timed_step_ms(engine, device: str) -> float:
    times = []
    for _ in range(TIMED_STEPS):
        sync(device)
        start = time.perf_counter()
        engine.step()
        sync(device)
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2] * 1e3


def traced(engine, device: str):
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.startswith("cuda") else [])
    with profile(activities=activities) as prof:
        for _ in range(TRACED_STEPS):
            engine.step()
        sync(device)
    return prof.key_averages()


def device_busy(events) -> tuple[float, int]:
    """(ms of device time per step, device operations per step): kernels and copies as the profiler saw them."""
    on_device = [e for e in events if e.device_type != torch.autograd.DeviceType.CPU]
    busy_us = sum(getattr(e, "self_device_time_total", 0) for e in on_device)
    return busy_us / 1e3 / TRACED_STEPS, sum(e.count for e in on_device) // TRACED_STEPS


def trace_rows(model_dir: str, device: str, dtype: str, rows: int) -> None:
    engine = decoding_engine(model_dir, device, dtype, rows)
    try:
        step_ms = timed_step_ms(engine, device)
        events = traced(engine, device)
    finally:
        engine.shutdown()
        del engine
        gc.collect()
        if device.startswith("cuda"):
            torch.cuda.empty_cache()
    busy_ms, ops = device_busy(events)
    share = f"{busy_ms / step_ms:.0%} of it" if step_ms else "-"
    figure(f"decode {rows} rows", f"step {step_ms:.2f} ms; device busy {busy_ms:.2f} ms ({share}), {ops} device ops")
    host = sorted((e for e in events if e.device_type == torch.autograd.DeviceType.CPU),
                  key=lambda e: -e.self_cpu_time_total)  # fmt: skip
    ops_ms = sum(e.self_cpu_time_total for e in host) / 1e3 / TRACED_STEPS
    figure(f"decode {rows} rows, host", f"{ops_ms:.2f} ms/step in operators (their own time); Python, the rest")
    for e in host[:TOP_HOST_OPS]:
        figure(f"decode {rows} rows, host: {e.key}",
               f"{e.self_cpu_time_total / 1e3 / TRACED_STEPS:.2f} ms/step, {e.count // TRACED_STEPS} calls/step")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--model-dir", required=True)
    parser.add_argument("--rows", default="1,64", help="decode batch sizes, comma-separated")
    parser.add_argument("--dry-run", action="store_true")
    args = parser.parse_args()
    dtype = "float32" if args.dry_run else "bfloat16"
    for rows in (int(r) for r in args.rows.split(",")):
        trace_rows(args.model_dir, args.device, dtype, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
