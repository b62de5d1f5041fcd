"""The servers the benchmarks measure, one at a time: a Tandem deployment on local Ray, vLLM's CPU build, or
llama.cpp's `llama-server` (the peer of GGUF users).

Each is a context manager yielding the base URL; leaving the block stops the
server (Tandem: workers and router; vLLM and llama.cpp: the whole process group).
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

from .peer_isa import peer_isa_env
from .sweeps import Config


@contextlib.contextmanager
def tandem_server(config: Config, model: str | None, engine: dict, served_model_name: str):
    """A `Deployment` (router on a thread of this process, workers as Ray actors) of `config`.

    Ray must be up (cluster.deployment.connect_ray)."""
    from cluster.deployment import Deployment
    from cluster.spec import parse_spec

    pool = {"torch_threads": config.torch_threads}
    spec = parse_spec({
        "model": model, "engine": engine,
        "router": {"port": 0, "routing_policy": config.routing_policy, "served_model_name": served_model_name},
        "prefill": {"replicas": config.num_prefill, **pool}, "decode": {"replicas": config.num_decode, **pool},
    })  # fmt: skip
    deployment = Deployment(spec)
    try:
        deployment.start()
        yield deployment.url
    finally:
        deployment.stop()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def peer_dtype() -> str:
    """vLLM's dtype beside Tandem: what Tandem's auto picks here (bf16 where the CPU computes it natively,
    which is vLLM's fastest there too; float32 elsewhere, where vLLM's bf16 is emulated and slow)."""
    from engine.config import auto_dtype

    return str(auto_dtype("cpu")).removeprefix("torch.")


def vllm_command(python: str, model_dir: str, served_model_name: str, port: int, engine: dict) -> list[str]:
    knobs = [flag for knob in ("max_model_len", "max_num_batched_tokens", "max_num_seqs") if engine.get(knob)
             for flag in (f"--{knob.replace('_', '-')}", str(engine[knob]))]  # those not given: vLLM's defaults
    return [python, "-m", "vllm.entrypoints.openai.api_server", "--model", model_dir, "--served-model-name",
            served_model_name, "--dtype", peer_dtype(), *knobs, "--host", "127.0.0.1", "--port", str(port)]  # fmt: skip


def vllm_env(python: str, threads: int) -> dict[str, str]:
    """vLLM CPU's settings: 4 GiB KV cache, OpenMP bound to the first `threads` cores, Intel OpenMP preloaded,
    and the kernels of the CPU that TANDEM_CPU_MAX_ISA plays (peer_isa)."""
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "4", "VLLM_CPU_OMP_THREADS_BIND": f"0-{threads - 1}",
           "VLLM_CPU_NUM_OF_RESERVED_CPU": "0"}  # fmt: skip
    env.pop("PYTHONPATH", None)  # Tandem's tree must not shadow vLLM's own packages
    iomp = Path(python).resolve().parent.parent / "lib" / "libiomp5.so"
    if iomp.exists():
        env["LD_PRELOAD"] = str(iomp)
    return peer_isa_env(env)


@contextlib.contextmanager
def vllm_server(python: str, model_dir: str, served_model_name: str, engine: dict, threads: int, log_path: Path,
                start_timeout_s: float = 600.0):  # fmt: skip
    port = free_port()
    cmd = vllm_command(python, model_dir, served_model_name, port, engine)
    with _peer_up("vLLM", cmd, vllm_env(python, threads), port, log_path, start_timeout_s) as url:
        yield url


def llamacpp_command(binary: str, gguf: str, served_model_name: str, port: int, threads: int, slots: int,
                     context_tokens: int) -> list[str]:  # fmt: skip
    """`llama-server` as `../shared/tools/peer-llamacpp` says to run it: `slots` parallel sequences batched
    continuously, one KV pool of `context_tokens` shared by them (-kvu, as vLLM's), `threads` for decode and
    for prompt batches. Where the CPU lists AMX tiles its repacked AMX path is left off (--no-repack): on the
    VMs seen here the tile instructions fault (SIGILL at the first request)."""
    from engine.cpu_features import read_cpuinfo

    cmd = [binary, "-m", gguf, "-a", served_model_name, "-np", str(slots), "-kvu", "-c", str(context_tokens),
           "-t", str(threads), "-tb", str(threads), "--no-webui", "--host", "127.0.0.1", "--port", str(port)]
    return cmd + (["--no-repack"] if "amx_tile" in read_cpuinfo().flags else [])


@contextlib.contextmanager
def llamacpp_server(binary: str, gguf: str, served_model_name: str, threads: int, log_path: Path,
                    slots: int = 64, context_tokens: int = 131072, start_timeout_s: float = 300.0):  # fmt: skip
    """llama.cpp's server on `gguf` (`llamacpp_command`), up until the block ends."""
    port = free_port()
    cmd = llamacpp_command(binary, gguf, served_model_name, port, threads, slots, context_tokens)
    with _peer_up("llama-server", cmd, None, port, log_path, start_timeout_s) as url:
        yield url


@contextlib.contextmanager
def _peer_up(name: str, cmd: list[str], env: dict[str, str] | None, port: int, log_path: Path,
             start_timeout_s: float):  # fmt: skip
    """`cmd` started in a process group of its own (output to `log_path`), its URL yielded once /health
    answers 200 (llama-server: 503 while it loads), the group stopped when the block ends."""
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + start_timeout_s
        while not _healthy(url):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{name} did not start (see {log_path}): {' '.join(cmd)}")
            time.sleep(1)
        yield url
    finally:
        _stop_group(proc)


def _stop_group(proc: subprocess.Popen) -> None:
    if proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGINT)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=5) as response:
            return response.status == 200
    except OSError:
        return False


# vLLM counts prompt tokens looked up in / found in its prefix cache; Tandem's router shows each worker's own
# hit rate (its router counters hold the decode side's hits, the blocks a decode worker did not need sent).
_VLLM_COUNTER = re.compile(r"^vllm:prefix_cache_(hits|queries)_total(?:\{[^}]*\})? ([0-9.e+]+)$", re.M)
_WORKER_RATE = re.compile(r'^tandem:worker_prefix_cache_hit_rate\{([^}]*)\} ([0-9.e+-]+)$', re.M)


def scrape_metrics(url: str) -> str:
    try:
        with urllib.request.urlopen(f"{url}/metrics", timeout=10) as response:
            return response.read().decode()
    except OSError:
        return ""


def vllm_cache_counts(text: str) -> dict[str, float] | None:
    """vLLM's prompt tokens looked up / found in its prefix cache so far, summed over engines (None: not vLLM)."""
    counts: dict[str, float] = {}
    for name, value in _VLLM_COUNTER.findall(text):
        counts[name] = counts.get(name, 0.0) + float(value)
    return counts if len(counts) == 2 else None


def tandem_hit_rate(text: str) -> float | None:
    """The mean of the prefill workers' own prefix-cache hit rates since they started (the decode workers'
    with no prefill pool); None if the text has none (not a Tandem router)."""
    rates: dict[str, list[float]] = {"prefill": [], "decode": []}
    for labels, value in _WORKER_RATE.findall(text):
        role = re.search(r'role="(\w+)"', labels)
        if role and role.group(1) in rates:
            rates[role.group(1)].append(float(value))
    chosen = rates["prefill"] or rates["decode"]
    return sum(chosen) / len(chosen) if chosen else None


def hit_rate_between(before: str, after: str) -> float | None:
    """The prefix-cache hit rate of what ran between two /metrics scrapes (Tandem: see tandem_hit_rate)."""
    old, new = vllm_cache_counts(before), vllm_cache_counts(after)
    if old is not None and new is not None:
        queries = new["queries"] - old["queries"]
        return (new["hits"] - old["hits"]) / queries if queries > 0 else None
    return tandem_hit_rate(after)
