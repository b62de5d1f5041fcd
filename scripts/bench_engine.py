"""Throughput of Tandem's `engine.LLM` against Hugging Face transformers (and optionally vLLM).

Two workloads on the default model (SmolLM2-135M-Instruct), greedy, EOS ignored:

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
import math
import os
import platform
import random
import shlex
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from tqdm import tqdm

import bench_report

WORKER = Path(__file__).with_name("_vllm_bench_worker.py")
MAX_MODEL_LEN = 2048

# Workload (a).
A_PROMPT_LEN = 32
A_OUTPUT_LEN = 128
# Workload (b): lognormal lengths, clipped. Medians and spreads are picked to look like
# ShareGPT conversations (long-tailed, most prompts and replies short) while keeping the
# whole run within a few minutes on a 2-core CPU.
B_PROMPT_MEDIAN, B_PROMPT_SIGMA, B_PROMPT_RANGE = 96, 0.8, (16, 512)
B_OUTPUT_MEDIAN, B_OUTPUT_SIGMA, B_OUTPUT_RANGE = 64, 0.7, (16, 256)
# Warm-up: short, but it prefills and decodes, so both code paths are initialised.
WARMUP_PROMPT_LEN, WARMUP_OUTPUT_LEN = 16, 4

# A fixed vocabulary for prompt text: real words tokenize like real text, unlike random ids.
WORDS = """
the of and to in is was that for on as with by at from his her they have this which
one had not but what all were when we there can an your said each she do how their if
will up other about out many then them these so some would make like him into time has
look two more write go see number no way could people my than first water been call who
oil its now find long down day did get come made may part over new sound take only little
work know place year live me back give most very after thing our just name good sentence
man think say great where help through much before line right too mean old any same tell
boy follow came want show also around form three small set put end does another well large
must big even such because turn here why ask went men read need land different home us move
try kind hand picture again change off play spell air away animal house point page letter
mother answer found study still learn should world high every near add food between own
below country plant last school father keep tree never start city earth eye light thought
head under story saw left few while along might close something seem next hard open example
begin life always those both paper together got group often run important until children
side feet car mile night walk white sea began grow took river four carry state once book
hear stop without second later miss idea enough eat face watch far really almost let above
girl sometimes mountain cut young talk soon list song being leave family question engine
""".split()


# ----------------------------------------------------------------------------- data


@dataclass
class Workload:
    """Prompts as token ids and the number of output tokens wanted for each."""

    name: str
    description: str
    prompts: list[list[int]]
    output_lens: list[int]

    @property
    def total_output(self) -> int:
        return sum(self.output_lens)


@dataclass
class Result:
    """One engine on one workload; derived rates are computed, not stored."""

    engine: str
    workload: str
    output_tokens: int
    wall_s: float
    num_steps: int
    step_time_s: float
    extra: dict = field(default_factory=dict)

    @property
    def tok_s(self) -> float:
        return self.output_tokens / self.wall_s

    @property
    def mean_step_ms(self) -> float:
        return 1000 * self.step_time_s / max(1, self.num_steps)

    def to_json(self) -> dict:
        return {**asdict(self), "tok_s": self.tok_s, "mean_step_ms": self.mean_step_ms}


def random_text_ids(tokenizer, num_tokens: int, rng: random.Random) -> list[int]:
    """Token ids of random text from WORDS, cut to exactly `num_tokens`."""
    words: list[str] = []
    ids: list[int] = []
    while len(ids) < num_tokens:
        # Words are about one token each; ask for what is missing plus a margin.
        words += [rng.choice(WORDS) for _ in range(num_tokens - len(ids) + 8)]
        ids = tokenizer.encode(" ".join(words), add_special_tokens=False)
    return ids[:num_tokens]


def lognormal_int(rng: random.Random, median: float, sigma: float, lo: int, hi: int) -> int:
    return min(hi, max(lo, round(rng.lognormvariate(math.log(median), sigma))))


def scaled(n: int, scale: float) -> int:
    return max(1, round(n * scale))


def workload_a(tokenizer, seed: int, scale: float) -> Workload:
    rng = random.Random(seed)
    out = scaled(A_OUTPUT_LEN, scale)
    return Workload(
        name="a",
        description=f"batch 1: {A_PROMPT_LEN}-token prompt, {out} output tokens",
        prompts=[random_text_ids(tokenizer, A_PROMPT_LEN, rng)],
        output_lens=[out],
    )


def workload_b(tokenizer, num_requests: int, seed: int, scale: float) -> Workload:
    # A different stream from (a), so the two never share a prompt prefix.
    rng = random.Random(seed + 1)
    prompt_lens = [lognormal_int(rng, B_PROMPT_MEDIAN, B_PROMPT_SIGMA, *B_PROMPT_RANGE) for _ in range(num_requests)]
    output_lens = [
        scaled(lognormal_int(rng, B_OUTPUT_MEDIAN, B_OUTPUT_SIGMA, *B_OUTPUT_RANGE), scale)
        for _ in range(num_requests)
    ]
    prompts = [random_text_ids(tokenizer, n, rng) for n in prompt_lens]
    desc = (
        f"{num_requests} requests: prompt {min(prompt_lens)}..{max(prompt_lens)} "
        f"(mean {sum(prompt_lens) / num_requests:.0f}), output {min(output_lens)}..{max(output_lens)} "
        f"(mean {sum(output_lens) / num_requests:.0f}) tokens"
    )
    return Workload("b", desc, prompts, output_lens)


def warmup_workload(tokenizer) -> Workload:
    rng = random.Random(12345)
    return Workload("warmup", "warm-up", [random_text_ids(tokenizer, WARMUP_PROMPT_LEN, rng)], [WARMUP_OUTPUT_LEN])


# ----------------------------------------------------------------------------- bandwidth bound


def measure_copy_bandwidth(mib: int = 256, reps: int = 10) -> dict:
    """Bytes/s of `dst.copy_(src)` on `mib` MiB tensors, with torch's current thread count.

    A copy reads and writes every byte, so it moves 2x the tensor size. The best
    repetition is kept: it is the machine's capability, the others mostly measure
    whatever else was running.
    """
    n = mib * 2**20 // 4
    src = torch.ones(n, dtype=torch.float32)
    dst = torch.empty_like(src)
    dst.copy_(src)  # first touch faults the pages in; not a bandwidth measurement
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        dst.copy_(src)
        times.append(time.perf_counter() - start)
    moved = 2 * src.numel() * src.element_size()
    times.sort()
    return {"best_bytes_s": moved / times[0], "median_bytes_s": moved / times[len(times) // 2], "mib": mib, "reps": reps}


def weight_bytes(model: torch.nn.Module) -> int:
    """Bytes of the checkpoint's weights, each storage once (tied embedding/lm_head count once).

    A linear whose weight the native kernels packed (and dropped as a parameter)
    counts its [out, in] matrix, not the packing's zero padding."""
    seen: dict[int, int] = {}
    for p in model.parameters():
        seen[p.data_ptr()] = p.numel() * p.element_size()
    for module in model.modules():
        packed = getattr(module, "kernel_weight", None)
        if getattr(module, "weight", True) is None and packed is not None:
            seen[packed.data.data_ptr()] = packed.out_features * packed.data.shape[1] * packed.data.element_size()
    return sum(seen.values())


# ----------------------------------------------------------------------------- tandem

_request_ids = itertools.count()


def load_tandem(dtype: str, kv_bytes: int):
    from engine import LLM

    return LLM(model=None, dtype=dtype, kv_cache_memory=kv_bytes, max_model_len=MAX_MODEL_LEN)


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
    print(f"[tandem] loading ({args.dtype})", file=sys.stderr)
    llm = load_tandem(args.dtype, args.kv_cache_gib * 2**30)
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


def load_hf(model_dir: str, dtype: str):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, dtype)).eval()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    tokenizer.padding_side = "left"  # decoder-only generation pads on the left
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model, tokenizer


@torch.inference_mode()
def hf_generate_batch(model, tokenizer, prompts: list[list[int]], new_tokens: int) -> torch.Tensor:
    """Greedy `generate` of exactly `new_tokens` tokens for a left-padded batch; returns new ids."""
    from transformers import GenerationConfig

    batch = tokenizer.pad({"input_ids": prompts}, padding=True, return_tensors="pt")
    config = GenerationConfig(
        do_sample=False,
        max_new_tokens=new_tokens,
        min_new_tokens=new_tokens,  # the EOS-ignoring equivalent: generation cannot stop early
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    out = model.generate(**batch, generation_config=config)
    new = out[:, batch["input_ids"].shape[1] :]
    assert new.shape[1] == new_tokens, f"transformers generated {new.shape[1]} tokens, asked for {new_tokens}"
    return new


def run_hf(model, tokenizer, workload: Workload, batch_size: int, progress: bool = True) -> Result:
    """Static batches in arrival order; each runs to its longest output; only useful tokens count."""
    chunks = [range(i, min(i + batch_size, len(workload.prompts))) for i in range(0, len(workload.prompts), batch_size)]
    steps, first = 0, None
    start = time.perf_counter()
    for chunk in tqdm(chunks, desc=f"transformers ({workload.name})", unit="batch", disable=not progress, leave=False):
        longest = max(workload.output_lens[i] for i in chunk)
        new = hf_generate_batch(model, tokenizer, [workload.prompts[i] for i in chunk], longest)
        steps += longest
        first = new[0, : workload.output_lens[0]].tolist() if first is None else first
    wall = time.perf_counter() - start
    return Result(
        "transformers",
        workload.name,
        output_tokens=workload.total_output,
        wall_s=wall,
        num_steps=steps,
        step_time_s=wall,
        extra={"first_output_token_ids": first, "batch_size": batch_size},
    )


def bench_hf(args, model_dir: str, workloads: list[Workload], warmup: Workload) -> list[Result]:
    print(f"[transformers] loading ({args.dtype})", file=sys.stderr)
    model, tokenizer = load_hf(model_dir, args.dtype)
    run_hf(model, tokenizer, warmup, args.hf_batch_size, progress=False)
    results = [run_hf(model, tokenizer, w, args.hf_batch_size) for w in workloads]
    del model
    gc.collect()
    return results


# ----------------------------------------------------------------------------- vLLM


def bench_vllm(args, model_dir: str, workloads: list[Workload], warmup: Workload) -> tuple[list[Result], dict]:
    """Run the workloads under vLLM in its own interpreter; ([], info) when it fails."""
    job = {
        "warmup": {"prompts": warmup.prompts, "output_lens": warmup.output_lens},
        "workloads": {w.name: {"prompts": w.prompts, "output_lens": w.output_lens} for w in workloads},
    }
    tmp = Path(tempfile.mkdtemp(prefix="tandem_vllm_bench_"))
    job_path, result_path, log_path = tmp / "job.json", tmp / "result.json", tmp / "worker.log"
    job_path.write_text(json.dumps(job))
    cmd = [
        args.vllm_python, str(WORKER),
        "--model-dir", model_dir,
        "--workload-json", str(job_path),
        "--result-json", str(result_path),
        "--dtype", args.dtype,
        "--threads", str(torch.get_num_threads()),
        "--kv-cache-gib", str(args.kv_cache_gib),
        "--max-model-len", str(MAX_MODEL_LEN),
    ]  # fmt: skip
    print(f"[vllm] running worker (log: {log_path}); loading and compiling takes a minute or two", file=sys.stderr)
    with open(log_path, "w") as log:
        try:
            proc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, timeout=args.vllm_timeout, cwd=tmp)
            rc = proc.returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
        except OSError as e:  # e.g. a wrong --vllm-python path
            log.write(f"could not start {args.vllm_python}: {e}\n")
            rc = "not started"
    if rc != 0 or not result_path.exists():
        tail = log_path.read_text(errors="replace").splitlines()[-30:]
        print(f"[vllm] worker failed ({rc}); last lines of {log_path}:\n" + "\n".join(tail), file=sys.stderr)
        return [], {"error": f"worker exit {rc}", "log": str(log_path)}
    report = json.loads(result_path.read_text())
    results = [
        Result(
            "vllm",
            name,
            output_tokens=r["output_tokens"],
            wall_s=r["wall_s"],
            num_steps=r["num_steps"],
            step_time_s=r["step_time_s"],
            extra={"first_output_token_ids": r["first_output_token_ids"]},
        )
        for name, r in report["results"].items()
    ]
    info = {k: report[k] for k in ("vllm_version", "settings", "load_s")}
    info["log"] = str(log_path)
    return results, info


# ----------------------------------------------------------------------------- reporting


def machine_info() -> dict:
    import transformers

    cpu = platform.processor() or "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "cpu": cpu,
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
        f"- Machine: {machine['cpu']} ({bench_report.instruction_set()}), {machine['cores']} cores, "
        f"torch threads {machine['torch_threads']}, "
        f"torch {machine['torch']}, transformers {machine['transformers']}",
        f"- Model: SmolLM2-135M-Instruct ({args.dtype}), `{info['tandem'].get('model_dir', '?')}`",
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
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32", help="for every engine")
    p.add_argument("--num-requests", type=int, default=64, help="requests in workload b")
    p.add_argument("--hf-batch-size", type=int, default=32, help="transformers' static batch size in workload b")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--output-len-scale", type=float, default=1.0, help="multiply every output length (quick checks)")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's own choice)")
    p.add_argument("--kv-cache-gib", type=int, default=4, help="KV cache for Tandem and vLLM")
    p.add_argument("--vllm-python", default=None, help="python of a virtualenv with vLLM (CPU build)")
    p.add_argument("--vllm-timeout", type=int, default=1800, help="seconds before the vLLM worker is abandoned")
    p.add_argument("--skip-hf", action="store_true", help="leave transformers out")
    p.add_argument("--markdown", default=None, help="the run's latest-result section in this file (BENCHMARKS.md), "
                   "its full record under benchmarks/history/ beside it")
    p.add_argument("--json", default=None, help="write raw results to this JSON file")
    args = p.parse_args(argv)
    if args.output_len_scale <= 0:
        p.error("--output-len-scale must be positive")
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
    if args.threads:
        torch.set_num_threads(args.threads)
    from transformers import AutoTokenizer

    from engine.model_source import resolve_model

    model_dir = str(resolve_model(None))
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    workloads, warmup = build_workloads(args, tokenizer), warmup_workload(tokenizer)
    machine = machine_info()
    print(f"[bench] {machine}", file=sys.stderr)

    bound = None
    if any(w.name == "a" for w in workloads):
        bw = measure_copy_bandwidth()
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
