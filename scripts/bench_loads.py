"""Serving under load as a user meets it: `tandem serve` with its defaults, driven by vLLM's load generator.

The server is the README's command (`tandem serve`: the default model, an embedded
local Ray, the layout it chooses for the machine and prints, every other setting at its default),
the client `vllm bench serve` (vLLM's own, through ../shared/tools/vllm-bench) and
ours (scripts/bench_serving.py), and the peers on the same model, one server up at a time:
vLLM's CPU server (on the checkpoint Tandem converted) and llama.cpp's `llama-server` (on the
GGUF file itself, its users' server). The loads:

  one-stream 8 prompts of 256 tokens, one at a time, 128 out
  burst      16 prompts of 128 tokens at once, 64 out
  poisson    24 prompts of 512 tokens, Poisson arrivals at 1 request/s, 128 out
  prefixes   36 prompts sharing 6 prefixes of 1,024 tokens (+ 32 of their own), 1.5 requests/s, 32 out
  flood      64 prompts of 256 tokens at once, 64 out

What must hold: every request completes (none failed) and no worker restarts
(`/admin/status` after each load). The table also gives throughput and latencies
beside the peers'.

    python scripts/bench_loads.py --with-vllm --with-llamacpp --markdown BENCHMARKS.md
    python scripts/bench_loads.py --model DIR --scale 0.5 --length-scale 0.25 --client ours   # a small model (CI)
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))
from bench_report import add_markdown_option, machine_line, record_run, run_text  # noqa: E402
from cluster_bench.servers import free_port, llamacpp_server, peer_dtype, vllm_server  # noqa: E402

SERVERS = (
    "Tandem: `tandem serve` with its defaults (embedded local Ray; the layout it chose and printed: {layout}; "
    "dtype auto: {dtype} here, max_model_len 8192, max_num_batched_tokens 2048). vLLM CPU "
    "(`../shared/tools/peer-vllm`): {dtype}, the same max_model_len and batched-token budget, OpenMP on both "
    "cores.{llamacpp} One server up at a time; "
    "clients: `vllm bench serve` (vLLM's own, `../shared/tools/vllm-bench`) and `scripts/bench_serving.py`, "
    "random prompts with `--ignore-eos`. Loads:\n"
)
VLLM_BENCH = ROOT.parent / "shared" / "tools" / "vllm-bench"
PEER_VLLM = ROOT.parent / "shared" / "tools" / "peer-vllm"
PEER_LLAMACPP = ROOT.parent / "shared" / "tools" / "peer-llamacpp"
LLAMACPP = (" llama.cpp (`../shared/tools/peer-llamacpp`, built here for this CPU): `llama-server` on the GGUF "
            "file itself ({gguf}), {slots} slots batched continuously over one shared KV pool of {context} tokens, "
            "2 threads.")
SERVED_NAME = "SmolLM2-135M-Instruct"
LLAMACPP_SLOTS = 64  # the flood's 64 at once, each in a slot of its own (vLLM and Tandem seat 256)
LLAMACPP_CONTEXT = 131072  # their shared KV pool: 2,048 tokens a slot


@dataclass(frozen=True)
class Load:
    name: str
    description: str
    num_prompts: int
    flags: tuple[str, ...]  # vllm bench serve's own flags (bench_serving.py takes the same)


def loads(scale: float = 1.0, length_scale: float = 1.0) -> list[Load]:
    """The five loads: `scale` times as many prompts (at least 4), `length_scale` times their token lengths
    (a small model's context), at the same rates."""

    def n(count: int) -> int:
        return max(4, round(count * scale))

    def t(count: int) -> int:
        return max(4, round(count * length_scale))

    def random(prompts: int, input_len: int, output_len: int, pacing: tuple[str, str], how: str) -> Load:
        flags = ("--dataset-name", "random", "--random-input-len", str(t(input_len)), "--random-output-len",
                 str(t(output_len)), *pacing)  # fmt: skip
        return Load("", f"{n(prompts)} prompts of {t(input_len)} tokens {how}, {t(output_len)} out", n(prompts), flags)

    groups = max(1, n(36) // 6)
    prefixes = Load("prefixes", f"{n(36)} prompts sharing {groups} prefixes of {t(1024)} tokens (+{t(32)} each), "
                    f"1.5 requests/s, {t(32)} out", n(36),
                    ("--dataset-name", "prefix_repetition", "--prefix-repetition-prefix-len", str(t(1024)),
                     "--prefix-repetition-suffix-len", str(t(32)), "--prefix-repetition-num-prefixes", str(groups),
                     "--prefix-repetition-output-len", str(t(32)), "--request-rate", "1.5"))  # fmt: skip
    return [
        dataclasses.replace(random(8, 256, 128, ("--max-concurrency", "1"), "one at a time"), name="one-stream"),
        dataclasses.replace(random(16, 128, 64, ("--max-concurrency", str(n(16))), "at once"), name="burst"),
        dataclasses.replace(random(24, 512, 128, ("--request-rate", "1"), "at Poisson 1 request/s"), name="poisson"),
        prefixes,
        dataclasses.replace(random(64, 256, 64, ("--max-concurrency", str(n(64))), "at once"), name="flood"),
    ]


def client_command(client: str, url: str, tokenizer: str, load: Load, out: Path, seed: int) -> list[str]:
    flags = list(load.flags)
    if client == "ours":  # our generator spells vLLM's dataset name with a dash
        flags = ["prefix-repetition" if f == "prefix_repetition" else f for f in flags]
        head = [sys.executable, str(ROOT / "scripts" / "bench_serving.py")]
    else:
        head = [str(VLLM_BENCH), "--backend", "openai", "--endpoint", "/v1/completions", "--model", SERVED_NAME]
    return [*head, "--base-url", url, "--tokenizer", tokenizer, "--num-prompts", str(load.num_prompts), *flags,
            "--ignore-eos", "--seed", str(seed), "--save-result", "--result-dir", str(out.parent),
            "--result-filename", out.name, "--percentile-metrics", "ttft,tpot,itl,e2el",
            "--metric-percentiles", "50,99"]  # fmt: skip


def run_load(client: str, url: str, tokenizer: str, load: Load, out: Path, seed: int) -> dict:
    cmd = client_command(client, url, tokenizer, load, out, seed)
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=3600)
    if done.returncode != 0 or not out.exists():
        raise RuntimeError(f"{client} client failed on {load.name}: {done.stderr[-2000:]}")
    return json.loads(out.read_text())


def vllm_bench(url: str, tokenizer: str, flags: list[str] | tuple[str, ...], seed: int, out: Path,
               what: str = "") -> dict:  # fmt: skip
    """`vllm bench serve` (vLLM's own load generator) on the completions endpoint at `url` with `flags`; its
    saved result (`out`). `what`: the load's name, for the error when it fails."""
    cmd = [str(VLLM_BENCH), "--backend", "openai", "--endpoint", "/v1/completions", "--model", SERVED_NAME,
           "--base-url", url, "--tokenizer", tokenizer, *flags, "--seed", str(seed),
           "--save-result", "--result-dir", str(out.parent), "--result-filename", out.name]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=3600)
    if done.returncode != 0 or not out.exists():
        raise RuntimeError(f"vllm bench serve failed{f' on {what}' if what else ''}: {done.stderr[-2000:]}")
    return json.loads(out.read_text())


@contextlib.contextmanager
def tandem_serve(model: str | None, log_path: Path, start_timeout_s: float = 900.0, flags: tuple[str, ...] = (),
                 env: dict[str, str] | None = None):  # fmt: skip
    """`tandem serve` exactly as the README starts it (plus a free port, --model when given, `flags`, and `env`
    over this process's environment).

    The port is free when chosen and may be taken before `serve` binds it (a Ray process's ephemeral port):
    then `serve` exits at once saying so, and is started again on another."""
    for tries_left in reversed(range(3)):
        proc, url = _start_serve(model, log_path, flags, env or {})
        try:
            _wait_healthy(proc, url, log_path, start_timeout_s)
            break
        except RuntimeError:
            _stop_serve(proc)
            if tries_left == 0 or "Address already in use" not in log_path.read_text():
                raise
    try:
        yield url
    finally:
        _stop_serve(proc)


def _start_serve(model: str | None, log_path: Path, flags: tuple[str, ...],
                 extra_env: dict[str, str]) -> tuple[subprocess.Popen, str]:  # fmt: skip
    port = free_port()
    cmd = [sys.executable, "-m", "cluster.cli", "serve", "--port", str(port), *(["--model", model] if model else []),
           *flags]  # fmt: skip
    env = {**{k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}, **extra_env}
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    return proc, f"http://127.0.0.1:{port}"


def _wait_healthy(proc: subprocess.Popen, url: str, log_path: Path, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not _get(f"{url}/health"):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"tandem serve did not start (see {log_path})")
        time.sleep(1)


def _stop_serve(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGINT)  # its own clean stop: workers, router, Ray
    try:
        proc.wait(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def chosen_layout(log_path: Path) -> str:
    """The layout `tandem serve` printed at its start ("tandem: ...; layout: WHY")."""
    for line in log_path.read_text().splitlines():
        if line.startswith("tandem: ") and "; layout: " in line:
            return line.split("; layout: ", 1)[1]
    return "not printed"


def _get(url: str, token: str | None = None) -> dict | None:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return json.load(response) if response.status == 200 else None
    except (OSError, ValueError):
        return None


def restarts(url: str) -> int:
    """Worker restarts so far, summed over both pools (`/admin/status`, with the admin token `tandem serve`
    wrote); RuntimeError when the status cannot be read (a count of 0 must mean none)."""
    from cluster.admin_token import read_token

    status = _get(f"{url}/admin/status", read_token(url))
    if status is None:
        raise RuntimeError(f"cannot read {url}/admin/status")
    return sum(w["restarts"] for pool in status["pools"].values() for w in pool["workers"])


def measure(server: str, url: str, args, result_dir: Path) -> list[dict]:
    rows = []
    for client in args.clients:
        for i, load in enumerate(loads(args.scale, args.length_scale)):
            before = restarts(url) if server == "tandem" else 0
            result = run_load(client, url, args.tokenizer, load, result_dir / f"{server}-{client}-{load.name}.json",
                              seed=i + 1)  # fmt: skip
            result.update(server=server, client=client, load=load.name,
                          restarts=restarts(url) - before if server == "tandem" else None)  # fmt: skip
            rows.append(result)
            print(f"{server} / {client} / {load.name}: {result['completed']} of {result['num_prompts']} completed, "
                  f"{result['failed']} failed, restarts {result['restarts']}", flush=True)  # fmt: skip
    return rows


def measure_llamacpp(args, result_dir: Path) -> list[dict]:
    """The loads against `llama-server` on the GGUF file the model was converted from (built once by
    ../shared/tools/peer-llamacpp, ~11 min on 2 cores)."""
    from engine.gguf_weights import gguf_source

    args.gguf = gguf_source(args.tokenizer)
    if args.gguf is None:
        raise SystemExit(f"--with-llamacpp: {args.tokenizer} was not converted from a GGUF file llama.cpp could serve")
    binary = subprocess.run([str(PEER_LLAMACPP)], capture_output=True, text=True, check=True).stdout.strip()
    with llamacpp_server(binary, str(args.gguf), SERVED_NAME, args.peer_threads, result_dir / "llamacpp.log",
                         slots=LLAMACPP_SLOTS, context_tokens=LLAMACPP_CONTEXT) as url:  # fmt: skip
        return measure("llamacpp", url, args, result_dir)


def table(rows: list[dict]) -> str:
    lines = ["| load | server | client | completed / sent | failed | worker restarts | req/s | output tok/s | "
             "TTFT p50 / p99 ms | TPOT p50 / p99 ms | E2E p50 ms |", "|---" * 11 + "|"]  # fmt: skip
    for r in rows:
        lines.append(
            f"| {r['load']} | {r['server']} | {'vllm bench serve' if r['client'] == 'vllm' else 'bench_serving.py'} "
            f"| {r['completed']} / {r['num_prompts']} | {r['failed']} | "
            f"{'–' if r['restarts'] is None else r['restarts']} | {r['request_throughput']:.2f} | "
            f"{r['output_throughput']:.1f} | {r['median_ttft_ms']:.0f} / {r['p99_ttft_ms']:.0f} | "
            f"{r['median_tpot_ms']:.1f} / {r['p99_tpot_ms']:.1f} | {r['median_e2el_ms']:.0f} |"
        )  # fmt: skip
    return "\n".join(lines)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", help="tandem serve --model (default: its default model)")
    p.add_argument("--client", default="vllm", choices=("vllm", "ours", "both"))
    p.add_argument("--scale", type=float, default=1.0, help="prompts per load, times this (rates unchanged)")
    p.add_argument("--length-scale", type=float, default=1.0, help="token lengths, times this (a small model)")
    p.add_argument("--with-vllm", action="store_true", help="then the same loads against vLLM's CPU server")
    p.add_argument("--peer-threads", type=int, default=2, help="threads of each peer server (vLLM, llama.cpp)")
    p.add_argument("--with-llamacpp", action="store_true",
                   help="then the same loads against llama.cpp's llama-server on the model's GGUF file")
    add_markdown_option(p)
    args = p.parse_args(argv)
    args.clients = ("vllm", "ours") if args.client == "both" else (args.client,)
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    from engine.model_source import resolve_model

    args.tokenizer = str(resolve_model(args.model))  # converts the default GGUF once (tandem serve would too)
    result_dir = Path(tempfile.mkdtemp(prefix="bench-loads-"))
    with tandem_serve(args.model, result_dir / "tandem.log") as url:
        rows = measure("tandem", url, args, result_dir)
    layout = chosen_layout(result_dir / "tandem.log")
    if args.with_vllm:
        python = subprocess.run([str(PEER_VLLM)], capture_output=True, text=True, check=True).stdout.strip()
        engine = {"max_model_len": 8192, "max_num_batched_tokens": 2048, "max_num_seqs": 256}  # tandem's defaults
        with vllm_server(python, args.tokenizer, SERVED_NAME, engine, args.peer_threads,
                         result_dir / "vllm.log") as url:  # fmt: skip
            rows += measure("vllm", url, args, result_dir)
    if args.with_llamacpp:
        rows += measure_llamacpp(args, result_dir)
    text = table(sorted(rows, key=lambda r: ([x.name for x in loads()].index(r["load"]), r["server"])))
    print(text)
    print(f"results: {result_dir}")
    if args.markdown:
        llamacpp = (LLAMACPP.format(gguf=args.gguf.name, slots=LLAMACPP_SLOTS, context=LLAMACPP_CONTEXT)
                    if args.with_llamacpp else "")  # fmt: skip
        details = SERVERS.format(layout=layout, dtype=peer_dtype(), llamacpp=llamacpp) + "\n".join(
            f"- `{x.name}`: {x.description}" for x in loads(args.scale, args.length_scale))
        record = run_text("bench_loads.py", sys.argv[1:], machine_line(), details, text)
        record_run(args.markdown, "bench_loads.py", record)
    lost = [r for r in rows if r["server"] == "tandem" and (r["failed"] or r["restarts"])]
    sys.exit(1 if lost else 0)


if __name__ == "__main__":
    main()
