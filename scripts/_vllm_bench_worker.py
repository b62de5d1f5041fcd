"""vLLM side of `bench_engine.py`, run under vLLM's own virtualenv.

It lives in its own script (and its own interpreter) because vLLM's CPU build
pins a torch and transformers that differ from ours, and its `LLM` spawns
worker processes, which needs the `__main__` guard below. It must not import
Tandem's `engine`: that package is not installed in vLLM's virtualenv.

Input: a JSON file written by `bench_engine.py`:

    {"warmup": {"prompts": [[ids...]], "output_lens": [n]},
     "workloads": {"a": {"prompts": [[ids...]], "output_lens": [n, ...]}, ...}}

Output: a JSON file with, per workload, the output token count, the wall time
and the engine-step timings, plus the settings vLLM ran with.

Usage (normally only through `bench_engine.py --vllm-python ...`):

    python scripts/_vllm_bench_worker.py --model-dir DIR --workload-json IN \
        --result-json OUT --dtype float32 --threads 2
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model-dir", required=True, help="local Hugging Face model directory")
    p.add_argument("--workload-json", required=True, help="prompts and output lengths (see module doc)")
    p.add_argument("--result-json", required=True, help="where to write the results")
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    p.add_argument("--threads", type=int, default=2, help="CPU threads for vLLM's model worker")
    p.add_argument("--kv-cache-gib", type=int, default=4, help="VLLM_CPU_KVCACHE_SPACE when not already set")
    p.add_argument("--max-model-len", type=int, default=2048)
    p.add_argument("--enforce-eager", action="store_true", help="skip vLLM's torch.compile warm-up")
    p.add_argument("--no-preload", action="store_true", help="do not preload Intel OpenMP (libiomp5)")
    return p.parse_args()


def reexec_with_iomp(args: argparse.Namespace) -> None:
    """Restart this script with the virtualenv's libiomp5 in LD_PRELOAD, when it has one.

    vLLM's CPU docs ask for Intel OpenMP to be preloaded for best performance
    (it warns at start-up otherwise), and LD_PRELOAD only takes effect when a
    process starts, so the script re-executes itself once. The venv's
    `intel-openmp` wheel ships the library; without it, nothing happens.
    """
    lib = os.path.join(sys.prefix, "lib", "libiomp5.so")
    preload = os.environ.get("LD_PRELOAD", "")
    if args.no_preload or "libiomp5" in preload or not os.path.exists(lib):
        return
    env = {**os.environ, "LD_PRELOAD": f"{lib}:{preload}" if preload else lib}
    os.execve(sys.executable, [sys.executable, *sys.argv], env)


def cpu_bind_list(threads: int) -> str:
    """The first `threads` CPUs this process may run on, as vLLM's "0,1,..." bind list.

    vLLM's "auto" binding keeps one core back for its scheduler process: on a
    2-core machine that leaves the model a single thread, while Tandem and
    transformers use both. Binding explicitly gives it the same thread count.
    """
    cpus = sorted(os.sched_getaffinity(0))[: max(1, threads)]
    return ",".join(str(c) for c in cpus)


def configure_env(args: argparse.Namespace) -> dict[str, str]:
    """Set vLLM's CPU knobs before vLLM is imported (it reads them at import); return them."""
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(args.kv_cache_gib))
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", cpu_bind_list(args.threads))
    os.environ.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")
    # The front-end and scheduler processes still drop to one torch thread (vLLM's choice);
    # the model worker takes its OpenMP threads from the bind list above.
    keys = (
        "VLLM_CPU_KVCACHE_SPACE",
        "VLLM_CPU_OMP_THREADS_BIND",
        "VLLM_CPU_NUM_OF_RESERVED_CPU",
        "OMP_NUM_THREADS",
        "LD_PRELOAD",
    )
    return {k: os.environ[k] for k in keys if k in os.environ}


class StepTimer:
    """Wraps `LLMEngine.step` so `LLM.generate` runs unchanged while every step is timed.

    vLLM's engine core runs in another process; one `step()` call returns the
    outputs of one core step, so the time between calls is its step time.
    """

    def __init__(self, engine):
        self._engine = engine
        self._inner = engine.step
        self.durations: list[float] = []
        engine.step = self._step

    def _step(self):
        start = time.perf_counter()
        out = self._inner()
        self.durations.append(time.perf_counter() - start)
        return out

    def reset(self) -> None:
        self.durations = []


def run_workload(llm, timer: StepTimer, spec: dict) -> dict:
    """Generate every prompt of `spec` at once; return token count and timings."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    prompts = [TokensPrompt(prompt_token_ids=list(ids)) for ids in spec["prompts"]]
    params = [SamplingParams(temperature=0.0, max_tokens=int(n), ignore_eos=True) for n in spec["output_lens"]]
    timer.reset()
    start = time.perf_counter()
    outputs = llm.generate(prompts, params, use_tqdm=False)
    wall = time.perf_counter() - start
    steps = timer.durations
    return {
        "output_tokens": sum(len(o.outputs[0].token_ids) for o in outputs),
        "wall_s": wall,
        "num_steps": len(steps),
        "step_time_s": sum(steps),
        "mean_step_ms": 1000 * sum(steps) / len(steps) if steps else None,
        "first_output_token_ids": list(outputs[0].outputs[0].token_ids),
    }


def main() -> int:
    args = parse_args()
    reexec_with_iomp(args)
    env = configure_env(args)
    import vllm  # only now: vLLM reads its environment variables when imported
    from vllm import LLM

    with open(args.workload_json) as f:
        job = json.load(f)
    llm_kwargs = {
        "model": args.model_dir,
        "dtype": args.dtype,
        "max_model_len": args.max_model_len,
        "enforce_eager": args.enforce_eager,
        "seed": 0,
    }
    load_start = time.perf_counter()
    llm = LLM(**llm_kwargs)
    load_s = time.perf_counter() - load_start
    timer = StepTimer(llm.llm_engine)
    # One short generate first, so lazy initialisation is not counted in the timings.
    run_workload(llm, timer, job["warmup"])
    results = {name: run_workload(llm, timer, spec) for name, spec in job["workloads"].items()}
    scheduler = llm.llm_engine.vllm_config.scheduler_config
    report = {
        "vllm_version": vllm.__version__,
        "settings": {
            "env": env,
            "llm_kwargs": llm_kwargs,
            "max_num_batched_tokens": scheduler.max_num_batched_tokens,
            "max_num_seqs": scheduler.max_num_seqs,
        },
        "load_s": load_s,
        "results": results,
    }
    with open(args.result_json, "w") as f:
        json.dump(report, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
