"""Time each engine.kernels Triton kernel against its PyTorch reference; report bandwidth.

Achieved bandwidth = the bytes a kernel must move (read its inputs once,
write its outputs once) / its time, printed next to the device's peak. Cases,
Llama-3-8B attention shapes (32 query heads, 8 KV heads, head_dim 128,
block size 16):

  cache_write  8192 new tokens scattered into the paged cache
  decode       batch 64 x 2048-token contexts, one query each (target on H100:
               >= 70% of HBM bandwidth); and batch 4 x 16384 (split along the
               context, flash-decoding)
  prefill      8 chunks of 512 new tokens, each after 1536 cached tokens
               (also reports TFLOP/s: prefill is compute-bound)

On CUDA both the kernel and the reference run. On CPU only the references run
(the Triton kernels need a GPU; the interpreter is for correctness, not speed)
and the output says so. The CPU peak is the measured copy bandwidth.
`--smoke` shrinks every case to a few blocks: its figures mean nothing, it only
proves the script runs (scripts/gpu_check.py's dry run).

    python scripts/bench_kernels.py                      # CUDA if present, else CPU
    python scripts/bench_kernels.py --markdown BENCHMARKS.md
    python scripts/bench_kernels.py --json kernels.json  # the rows and the peak, for scripts/gpu_check.py
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import statistics
import subprocess
from pathlib import Path

import torch

import bench_report
from bench_engine import measure_copy_bandwidth
from engine.layers.kernel_timing import sample_time

# Spec-sheet HBM bandwidth, bytes/s, by a substring of torch's device name.
PEAK_BANDWIDTH = {"H200": 4.8e12, "H100 PCIe": 2.0e12, "H100": 3.35e12, "A100-SXM4-80GB": 2.04e12, "A100": 1.56e12}
NUM_HEADS, NUM_KV_HEADS, HEAD_DIM, BLOCK_SIZE = 32, 8, 128, 16
# Cache writes are copies: exact. Attention in bfloat16 differs by rounding (outputs are O(0.1)).
MAX_DIFFERENCE = {"cache_write": 0.0, "decode": 2e-2, "prefill": 2e-2}


def paged_cache(num_seqs: int, ctx: int, dtype, device):
    """A cache holding num_seqs contexts of ctx tokens in shuffled blocks, and their block tables."""
    blocks_per_seq = -(-ctx // BLOCK_SIZE)
    num_blocks = num_seqs * blocks_per_seq
    shape = (num_blocks, BLOCK_SIZE, NUM_KV_HEADS, HEAD_DIM)
    k, v = torch.randn(shape, dtype=dtype, device=device), torch.randn(shape, dtype=dtype, device=device)
    tables = torch.randperm(num_blocks, device=device).view(num_seqs, blocks_per_seq)
    return k, v, tables


def case_cache_write(dtype, device, tokens: int = 8192):
    from engine.kernels import cache_write

    k_cache, v_cache, _ = paged_cache(tokens // BLOCK_SIZE, BLOCK_SIZE, dtype, device)
    key = torch.randn(tokens, NUM_KV_HEADS, HEAD_DIM, dtype=dtype, device=device)
    slots = torch.randperm(tokens, device=device)
    args = (key, key.clone(), k_cache, v_cache, slots)
    moved = 4 * key.numel() * key.element_size() + slots.numel() * 8  # read K, V; write K, V
    return "cache_write", args, {}, moved, 0, cache_write, "reshape_and_cache"


def case_decode(dtype, device, batch: int = 64, ctx: int = 2048):
    from engine.kernels import decode_attention

    k_cache, v_cache, tables = paged_cache(batch, ctx, dtype, device)
    query = torch.randn(batch, NUM_HEADS, HEAD_DIM, dtype=dtype, device=device)
    seq_lens = torch.full((batch,), ctx, dtype=torch.int32, device=device)
    args = (query, k_cache, v_cache, tables, seq_lens, HEAD_DIM**-0.5)
    moved = 2 * k_cache.numel() * k_cache.element_size() + 2 * query.numel() * query.element_size()
    flops = 4 * batch * NUM_HEADS * ctx * HEAD_DIM
    name = f"decode {batch}x{ctx}"
    return name, args, {"max_seq_len": ctx}, moved, flops, decode_attention, "paged_decode_attention"


def case_long_decode(dtype, device, batch: int = 4, ctx: int = 16384):
    # Few sequences: the kernel must split along the context to fill the GPU.
    return case_decode(dtype, device, batch=batch, ctx=ctx)


def case_prefill(dtype, device, chunks: int = 8, new: int = 512, cached: int = 1536):
    from engine.kernels import prefill_attention

    ctx = cached + new
    k_cache, v_cache, tables = paged_cache(chunks, ctx, dtype, device)
    query = torch.randn(chunks * new, NUM_HEADS, HEAD_DIM, dtype=dtype, device=device)
    starts = torch.arange(0, chunks * new + 1, new, dtype=torch.int32, device=device)
    seq_lens = torch.full((chunks,), ctx, dtype=torch.int32, device=device)
    args = (query, k_cache, v_cache, tables, starts, seq_lens, new, HEAD_DIM**-0.5)
    moved = 2 * k_cache.numel() * k_cache.element_size() + 2 * query.numel() * query.element_size()
    visible_keys = chunks * sum(cached + j + 1 for j in range(new))
    flops = 4 * NUM_HEADS * visible_keys * HEAD_DIM
    return "prefill", args, {}, moved, flops, prefill_attention, "paged_prefill_attention"


# --smoke: each case at a few blocks (the same code paths, the long decode still longer than the rest).
SMOKE_SIZES = {
    case_cache_write: dict(tokens=256),
    case_decode: dict(batch=4, ctx=256),
    case_long_decode: dict(batch=2, ctx=1024),
    case_prefill: dict(chunks=2, new=64, cached=64),
}


def time_call(fn, device, reps: int) -> float:
    """Median seconds per call."""
    if device.type == "cuda":
        import triton.testing

        return triton.testing.do_bench(fn, warmup=25, rep=max(100, reps * 10), return_mode="median") / 1e3
    fn()  # warm: first-touch pages, lazy initialisation
    return statistics.median(sample_time(fn) for _ in range(reps))  # samples of 2 ms at least, as the kernel choice


def run_case(case, device, reps: int) -> list[dict]:
    name, args, kwargs, moved, flops, module, entry = case
    impls = [("reference", getattr(module, entry + "_ref"))]
    if device.type == "cuda":
        impls.insert(0, ("triton", getattr(module, entry)))
        # A fast wrong kernel is no result: check before timing.
        diff = max_difference(module, entry, args, kwargs)
        print(f"{name}: triton vs reference, max abs difference {diff:.2e}")
        if diff > MAX_DIFFERENCE[name.split()[0]]:
            raise SystemExit(f"{name}: the Triton kernel disagrees with its reference ({diff:.2e}); not timing it")
    rows = []
    for impl, fn in impls:
        seconds = time_call(lambda: fn(*args, **kwargs), device, reps)
        rows.append(dict(case=name, impl=impl, seconds=seconds, bytes=moved, flops=flops))
    return rows


def max_difference(module, entry, args, kwargs) -> float:
    """Largest |kernel - reference| over the output (attention) or the written caches (cache write)."""
    outputs = []
    for fn in (getattr(module, entry), getattr(module, entry + "_ref")):
        fresh = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
        out = fn(*fresh, **kwargs)
        outputs.append(torch.cat([fresh[2].flatten(), fresh[3].flatten()]) if out is None else out.flatten())
    return (outputs[0].float() - outputs[1].float()).abs().max().item()


def device_peak(device) -> tuple[float, str]:
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        for key, peak in PEAK_BANDWIDTH.items():
            if key in name:
                copy = _cuda_copy_bandwidth()
                return peak, f"{name} spec-sheet HBM bandwidth; a device copy reaches {copy / 1e9:.0f} GB/s"
        return float("nan"), f"{name}: peak unknown"
    copy = measure_copy_bandwidth()
    return copy["best_bytes_s"], f"CPU copy bandwidth (best of {copy['reps']} x {copy['mib']} MiB)"


def _cuda_copy_bandwidth() -> float:
    import triton.testing

    src = torch.empty(2**30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    seconds = triton.testing.do_bench(lambda: dst.copy_(src), return_mode="median") / 1e3
    return 2 * src.numel() / seconds


def table(rows: list[dict], peak: float) -> str:
    lines = [
        "| kernel | implementation | time (us) | GB/s | % of peak | TFLOP/s | vs reference |",
        "|---|---|---|---|---|---|---|",
    ]
    ref_time = {r["case"]: r["seconds"] for r in rows if r["impl"] == "reference"}
    for r in rows:
        bw = r["bytes"] / r["seconds"]
        tflops = f"{r['flops'] / r['seconds'] / 1e12:.2f}" if r["flops"] else "-"
        speedup = ref_time[r["case"]] / r["seconds"]
        lines.append(
            f"| {r['case']} | {r['impl']} | {r['seconds'] * 1e6:.0f} | {bw / 1e9:.1f} | {100 * bw / peak:.0f}% "
            f"| {tflops} | {speedup:.2f}x |"
        )
    return "\n".join(lines)


def machine(device) -> str:
    if device.type == "cuda":
        return f"{torch.cuda.get_device_name(device)}, torch {torch.__version__}"
    cpu = platform.processor() or "unknown CPU"
    for line in open("/proc/cpuinfo"):
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
            break
    return f"{cpu}, {torch.get_num_threads()} torch threads, torch {torch.__version__}"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default=None, help="bfloat16 on CUDA, float32 on CPU by default")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--smoke", action="store_true", help="every case at a few blocks: proves the script runs")
    parser.add_argument("--json", default=None, help="write the rows, the peak and the device to this JSON file")
    bench_report.add_markdown_option(parser)
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    dtype = getattr(torch, args.dtype or ("bfloat16" if device.type == "cuda" else "float32"))
    torch.manual_seed(0)
    note = "" if device.type == "cuda" else "CPU: references only (the Triton kernels need a GPU)."
    peak, peak_source = device_peak(device)
    rows = []
    for make in (case_cache_write, case_decode, case_long_decode, case_prefill):
        rows += run_case(make(dtype, device, **(SMOKE_SIZES[make] if args.smoke else {})), device, args.reps)
    result = table(rows, peak)
    smoke = " --smoke" if args.smoke else ""
    header = [
        f"- Command: `python scripts/bench_kernels.py --device {args.device} --reps {args.reps}{smoke}` (dtype {dtype})",
        f"- Machine: {machine(device)}, commit {_commit()}",
        f"- Peak: {peak / 1e9:.1f} GB/s ({peak_source})",
    ] + ([f"- {note}"] if note else [])
    print("\n".join(header) + "\n\n" + result)
    if args.json:
        raw = dict(device=machine(device), dtype=str(dtype), peak_bytes_s=peak, peak_source=peak_source, rows=rows)
        Path(args.json).write_text(json.dumps(raw, indent=1))
    if args.markdown:
        stamp = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
        record = f"### Kernels on {device.type}, {stamp}\n\n" + "\n".join(header) + "\n\n" + result + "\n"
        bench_report.record_run(args.markdown, "bench_kernels.py", record)


def _commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    except OSError:
        return "unknown"


if __name__ == "__main__":
    main()
