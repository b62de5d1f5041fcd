"""The baselines `bench_engine.py` runs beside Tandem on the same workloads: Hugging Face transformers
(static left-padded batches, in this process) and vLLM (its CPU build, in its own interpreter through
`_vllm_bench_worker.py`)."""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from tqdm import tqdm

from cluster_bench.peer_isa import peer_isa_env
from engine_workloads import Result, Workload

WORKER = Path(__file__).with_name("_vllm_bench_worker.py")
MAX_MODEL_LEN = 2048


def load_hf(model_dir: str, dtype: str, device: str = "cpu"):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, dtype)).eval().to(device)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    tokenizer.padding_side = "left"  # decoder-only generation pads on the left
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model, tokenizer


@torch.inference_mode()
def hf_generate_batch(model, tokenizer, prompts: list[list[int]], new_tokens: int) -> torch.Tensor:
    """Greedy `generate` of exactly `new_tokens` tokens for a left-padded batch; returns new ids."""
    from transformers import GenerationConfig

    batch = tokenizer.pad({"input_ids": prompts}, padding=True, return_tensors="pt").to(model.device)
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
    print(f"[transformers] loading ({args.dtype}, {args.device})", file=sys.stderr)
    model, tokenizer = load_hf(model_dir, args.dtype, args.device)
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
            proc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, timeout=args.vllm_timeout, cwd=tmp,
                                  env=peer_isa_env(dict(os.environ)))  # the played CPU's kernels
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
