"""Throughput of Tandem's `engine.LLM` against Hugging Face transformers (and optionally vLLM).

Two workloads on the default model (SmolLM2-135M-Instruct, or --model DIR), greedy, EOS ignored:

  (a) batch 1: one ~32-token prompt, 128 output tokens. Also prints the
      memory-bandwidth bound: every decode step reads all weights once, so
      tok/s <= copy bandwidth / weight bytes.
  (b) 64 requests with ShareGPT-like spread of prompt (16..512) and output
      (16..256) lengths. Tandem gets them all at once (continuous batching);
      transformers serves static left-padded batches of 32, each running until
      its longest output is done, and only each request's own output tokens
      count as useful.

Examples:

    python scripts/bench_engine.py                                 # both workloads
    python scripts/bench_engine.py --workload a --dtype bfloat16
    python scripts/bench_engine.py --output-len-scale 0.1          # quick check
    python scripts/bench_engine.py --device cuda --model DIR       # on a GPU (scripts/gpu_check.py)
    python scripts/bench_engine.py --vllm-python /work/vllm-venv/bin/python \
        --markdown BENCHMARKS.md --json bench.json

With --vllm-python the same workloads run under vLLM through
`scripts/_vllm_bench_worker.py` in that interpreter (a separate process).
"""

from __future__ import annotations

import argparse
import datetime
import gc
import itertools
import json
import os
import platform
import shlex
import sys
import time
from dataclasses import asdict
from pathlib import Path

import torch
from tqdm import tqdm

import bench_report
from cluster_bench.servers import peer_dtype
from engine.config import QUANTIZATIONS
from engine_baselines import MAX_MODEL_LEN, bench_hf, bench_vllm
from engine_workloads import Result, Workload, warmup_workload, workload_a, workload_b


def measure_copy_bandwidth(mib: int = 256, reps: int = 10, device: str = "cpu") -> dict:
    """Bytes/s of `dst.copy_(src)` on `mib` MiB tensors, with torch's current thread count (on CPU).

    A copy reads and writes every byte, so it moves 2x the tensor size. The best
    repetition is kept: it is the machine's capability, the others mostly measure
    whatever else was running. On a GPU it is the device memory's bandwidth.
    """
    n = mib * 2**20 // 4
    src = torch.ones(n, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)  # first touch faults the pages in; not a bandwidth measurement
    times = []
    for _ in range(reps):
        _synchronize(device)
        start = time.perf_counter()
        dst.copy_(src)
        _synchronize(device)  # a CUDA copy returns before it is done
        times.append(time.perf_counter() - start)
    moved = 2 * src.numel() * src.element_size()
    times.sort()
    return {"best_bytes_s": moved / times[0], "median_bytes_s": moved / times[len(times) // 2], "mib": mib, "reps": reps}


def _synchronize(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize(device)


def weight_bytes(model: torch.nn.Module) -> int:
    """Bytes of the weights a decode step reads, each storage once (tied embedding/lm_head count once).

    A linear whose weight a kernel prepared in its own layout (and dropped as a parameter) counts its
    [out, in] matrix, not the layout's padding; one in a GGUF file's blocks counts the blocks, and so does
    an lm_head in blocks, in place of its dense storage (a tied embedding's lookups read a few rows of it)."""
    from engine.layers.quantized_choice import BlockForms

    seen: dict[int, int] = {}
    for p in model.parameters():
        seen[p.data_ptr()] = p.numel() * p.element_size()
    for module in model.modules():
        kernel_weight = getattr(module, "kernel_weight", None)
        if getattr(module, "weight", True) is None and isinstance(kernel_weight, BlockForms):
            seen[id(module)] = _blocks_read(kernel_weight)
        elif getattr(module, "weight", True) is None and kernel_weight is not None:
            dense = module.dense_weight()
            seen[id(module)] = dense.numel() * dense.element_size()
    head = getattr(model, "lm_head_weight", None)
    if isinstance(head, BlockForms):
        seen[model.lm_head.weight.data_ptr()] = _blocks_read(head)
    return sum(seen.values())


def _blocks_read(weight) -> int:
    """The bytes of the blocks as the kernels read them (float32 scales), or as the file has them when no band
    reads the blocks."""
    return weight.forms["quantized"].nbytes if "quantized" in weight.forms else weight.blocks.nbytes


# ----------------------------------------------------------------------------- tandem

_request_ids = itertools.count()


def load_tandem(dtype: str, kv_bytes: int, model: str | None = None, device: str = "cpu", quantization: str = "auto"):
    from engine import LLM

    return LLM(model=model, dtype=dtype, kv_cache_memory=kv_bytes, max_model_len=MAX_MODEL_LEN, device=device,
               quantization=quantization)  # fmt: skip


def run_tandem(llm, workload: Workload, progress: bool = True) -> Result:
    """Queue every request, then drive `engine.step()` ourselves to time each step."""
    from engine import SamplingParams

    engine = llm.engine
    start = time.perf_counter()
    for ids, n in zip(workload.prompts, workload.output_lens):
        params = SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)
        engine.add_request(f"bench-{next(_request_ids)}", {"prompt_token_ids": ids}, params)
    step_times, finished = [], []
    with tqdm(total=workload.total_output, desc=f"tandem ({workload.name})", unit="tok", disable=not progress, leave=False) as bar:
        while engine.has_unfinished_requests():
            t0 = time.perf_counter()
            outs = engine.step()
            step_times.append(time.perf_counter() - t0)
            bar.update(len(outs))  # each request that advanced gained one token
            finished += [o for o in outs if o.finished]
    wall = time.perf_counter() - start
    return Result(
        "tandem",
        workload.name,
        output_tokens=sum(len(o.outputs[0].token_ids) for o in finished),
        wall_s=wall,
        num_steps=len(step_times),
        step_time_s=sum(step_times),
        extra={"first_output_token_ids": _first_output(finished)},
    )


def _first_output(finished) -> list[int]:
    """Token ids of the earliest-queued request (the only one, in workload a)."""
    first = min(finished, key=lambda o: int(o.request_id.rsplit("-", 1)[1]))
    return list(first.outputs[0].token_ids)


def bench_tandem(args, workloads: list[Workload], warmup: Workload) -> tuple[list[Result], dict]:
    print(f"[tandem] loading ({args.dtype}, quantization {args.quantization})", file=sys.stderr)
    llm = load_tandem(args.dtype, args.kv_cache_gib * 2**30, args.model, args.device, args.quantization)
    run_tandem(llm, warmup, progress=False)
    info = {
        "weight_bytes": weight_bytes(llm.engine.runner.model),
        "kv_cache_gib": args.kv_cache_gib,
        "max_num_batched_tokens": llm.engine.config.scheduler.max_num_batched_tokens,
        "max_num_seqs": llm.engine.config.scheduler.max_num_seqs,
        "model_dir": llm.engine.config.model_dir,
    }
    results = [run_tandem(llm, w) for w in workloads]
    del llm
    gc.collect()  # free weights and KV cache before the next engine loads
    return results, info


# ----------------------------------------------------------------------------- transformers


def machine_info(device: str = "cpu") -> dict:
    import transformers

    from engine.cpu_features import cpu_features

    gpu = {"gpu": torch.cuda.get_device_name(device)} if device.startswith("cuda") else {}
    return {
        **gpu,
        "cpu": cpu_features().model,
        "cores": len(os.sched_getaffinity(0)),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
    }


def find(results: list[Result], engine: str, workload: str) -> Result | None:
    return next((r for r in results if r.engine == engine and r.workload == workload), None)


def ratio(r: Result, base: Result | None) -> str:
    return f"{r.tok_s / base.tok_s:.2f}x" if base else "-"


def results_table(results: list[Result], workloads: list[Workload]) -> str:
    """A markdown table: one row per engine and workload, ratios by throughput."""
    has_vllm = any(r.engine == "vllm" for r in results)
    head = ["engine", "workload", "output tokens", "wall time s", "output tok/s", "mean step ms", "vs transformers"]
    head += ["vs vLLM"] if has_vllm else []
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for w in workloads:
        hf, vl = find(results, "transformers", w.name), find(results, "vllm", w.name)
        for engine in ("tandem", "transformers", "vllm"):
            r = find(results, engine, w.name)
            if r is None:
                continue
            cells = [engine, w.name, str(r.output_tokens), f"{r.wall_s:.2f}", f"{r.tok_s:.1f}", f"{r.mean_step_ms:.1f}"]
            cells += [ratio(r, hf)] + ([ratio(r, vl)] if has_vllm else [])
            rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


def bound_lines(bound: dict, results: list[Result]) -> list[str]:
    lines = [
        f"weight bytes per decode step: {bound['weight_bytes'] / 2**20:.1f} MiB; "
        f"copy bandwidth (best of {bound['reps']} x {bound['mib']} MiB, {bound['threads']} threads): "
        f"{bound['bandwidth_bytes_s'] / 1e9:.2f} GB/s (median {bound['median_bytes_s'] / 1e9:.2f})",
        f"memory-bandwidth bound at batch 1: {bound['bound_tok_s']:.1f} tok/s",
    ]
    for r in (find(results, e, "a") for e in ("tandem", "transformers", "vllm")):
        if r is not None:
            lines.append(f"{r.engine} (a): {r.tok_s:.1f} tok/s = {r.tok_s / bound['bound_tok_s']:.0%} of the bound")
    return lines


def agreement_line(results: list[Result], engine: str) -> str | None:
    """How many greedy tokens of workload (a) `engine` shares with transformers: a sanity check."""
    ours, ref = find(results, engine, "a"), find(results, "transformers", "a")
    if not ours or not ref:
        return None
    a, b = ours.extra["first_output_token_ids"], ref.extra["first_output_token_ids"]
    same = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    return f"greedy check (a): {engine} matches transformers for the first {same}/{len(b)} tokens"


def markdown_section(args, machine: dict, info: dict, workloads: list[Workload], results: list[Result], bound) -> str:
    now = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
    cmd = " ".join(shlex.quote(a) for a in [sys.executable] + sys.argv)
    out = [
        f"## Engine throughput, {now}",
        "",
        f"- Command: `{cmd}`",
        f"- Machine: {machine['gpu'] + ', host ' if 'gpu' in machine else ''}"
        f"{machine['cpu']} ({bench_report.instruction_set()}), {machine['cores']} cores, "
        f"torch threads {machine['torch_threads']}, "
        f"torch {machine['torch']}, transformers {machine['transformers']}",
        f"- Model: {args.model or 'SmolLM2-135M-Instruct'} ({args.dtype}, {args.device}, Tandem's quantization "
        f"{args.quantization}), "
        f"`{info['tandem'].get('model_dir', '?')}`",
        f"- Tandem: KV cache {args.kv_cache_gib} GiB, max_num_batched_tokens "
        f"{info['tandem'].get('max_num_batched_tokens')}, max_model_len {MAX_MODEL_LEN}; "
        f"transformers: static batches of {args.hf_batch_size}, left padded",
    ]
    if "vllm" in info:
        v = info["vllm"]
        settings = v.get("settings", {})
        out.append(
            f"- vLLM: {v.get('vllm_version', '?')}, max_num_batched_tokens "
            f"{settings.get('max_num_batched_tokens', '?')}, env {settings.get('env', v.get('error'))}"
        )
    out += [f"- Workload {w.name}: {w.description}" for w in workloads]
    out += ["", results_table(results, workloads), ""]
    if bound:
        out += [f"- {line}" for line in bound_lines(bound, results)]
    out += [f"- {line}" for line in extra_lines(results, workloads)]
    return "\n".join(out) + "\n\n"


def print_summary(results: list[Result], workloads: list[Workload], bound: dict | None) -> None:
    print()
    for w in workloads:
        print(f"workload {w.name}: {w.description}")
    print(results_table(results, workloads))
    if bound:
        for line in bound_lines(bound, results):
            print(line)
    for line in extra_lines(results, workloads):
        print(line)


def extra_lines(results: list[Result], workloads: list[Workload]) -> list[str]:
    """The greedy sanity check and the vLLM/Tandem throughput ratios."""
    lines = [line for line in (agreement_line(results, e) for e in ("tandem", "vllm")) if line]
    for w in workloads:
        ours, vl = find(results, "tandem", w.name), find(results, "vllm", w.name)
        if ours and vl:
            lines.append(f"vLLM/tandem throughput ratio ({w.name}): {vl.tok_s / ours.tok_s:.2f}")
    return lines


# ----------------------------------------------------------------------------- main


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workload", choices=("a", "b", "both"), default="both")
    p.add_argument("--dtype", choices=("auto", "float32", "bfloat16"), default="auto",
                   help="for every engine; auto: what Tandem's default picks on this machine (cluster_bench.servers.peer_dtype)")
    p.add_argument("--quantization", choices=QUANTIZATIONS, default="auto",
                   help="Tandem's (engine.config.QUANTIZATIONS): a GGUF model's blocks (auto, the default; gguf: "
                        "float products only), any linear in Q8_0 (int8) or widened (none)")
    p.add_argument("--num-requests", type=int, default=64, help="requests in workload b")
    p.add_argument("--hf-batch-size", type=int, default=32, help="transformers' static batch size in workload b")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--output-len-scale", type=float, default=1.0, help="multiply every output length (quick checks)")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's own choice)")
    p.add_argument("--kv-cache-gib", type=int, default=4, help="KV cache for Tandem and vLLM")
    p.add_argument("--model", default=None, help="a model directory (default: the default model, SmolLM2-135M-Instruct)")
    p.add_argument("--device", default="cpu", help="cpu, or cuda for Tandem and transformers (not vLLM's CPU build)")
    p.add_argument("--vllm-python", default=None, help="python of a virtualenv with vLLM (CPU build)")
    p.add_argument("--vllm-timeout", type=int, default=1800, help="seconds before the vLLM worker is abandoned")
    p.add_argument("--skip-hf", action="store_true", help="leave transformers out")
    bench_report.add_markdown_option(p)
    p.add_argument("--json", default=None, help="write raw results to this JSON file")
    args = p.parse_args(argv)
    if args.output_len_scale <= 0:
        p.error("--output-len-scale must be positive")
    if args.vllm_python and args.device != "cpu":
        p.error("--vllm-python runs vLLM's CPU build: leave --device at cpu")
    return args


def build_workloads(args, tokenizer) -> list[Workload]:
    names = ("a", "b") if args.workload == "both" else (args.workload,)
    out = []
    if "a" in names:
        out.append(workload_a(tokenizer, args.seed, args.output_len_scale))
    if "b" in names:
        out.append(workload_b(tokenizer, args.num_requests, args.seed, args.output_len_scale))
    return out


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.dtype == "auto":  # the user's default, resolved once so that every engine runs the same dtype
        args.dtype = peer_dtype()
    if args.threads:
        torch.set_num_threads(args.threads)
    from transformers import AutoTokenizer

    from engine.model_source import resolve_model

    model_dir = str(resolve_model(args.model))
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    workloads, warmup = build_workloads(args, tokenizer), warmup_workload(tokenizer)
    machine = machine_info(args.device)
    print(f"[bench] {machine}", file=sys.stderr)

    bound = None
    if any(w.name == "a" for w in workloads):
        bw = measure_copy_bandwidth(device=args.device)
        bound = {"bandwidth_bytes_s": bw["best_bytes_s"], "threads": torch.get_num_threads(), **bw}

    results, info = [], {}
    tandem_results, info["tandem"] = bench_tandem(args, workloads, warmup)
    results += tandem_results
    if bound:
        bound["weight_bytes"] = info["tandem"]["weight_bytes"]
        bound["bound_tok_s"] = bound["bandwidth_bytes_s"] / bound["weight_bytes"]
    if not args.skip_hf:
        results += bench_hf(args, model_dir, workloads, warmup)
    if args.vllm_python:
        vllm_results, info["vllm"] = bench_vllm(args, model_dir, workloads, warmup)
        results += vllm_results

    print_summary(results, workloads, bound)
    if args.markdown:
        history = bench_report.record_run(args.markdown, "bench_engine.py",
                                          markdown_section(args, machine, info, workloads, results, bound))  # fmt: skip
        print(f"results in {history}, and as the latest in {args.markdown}")
    if args.json:
        raw = {
            "argv": sys.argv,
            "machine": machine,
            "info": info,
            "bound": bound,
            "workloads": [asdict(w) for w in workloads],
            "results": [r.to_json() for r in results],
        }
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(raw, indent=1))
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
