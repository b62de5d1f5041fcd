"""Disaggregated (1 prefill + 1 decode actor) next to colocated (1 decode actor prefilling itself) on a local Ray.

Same requests, same total torch threads: the colocated actor gets `--threads`
threads, each disaggregated actor half of them. All requests are started at
once through the handoff (`router.handoff.start_request`); the client
stamps each TokenDelta as it arrives on its ZMQ token stream. Reported: time
to first token (submit to first token), inter-token latency (per request,
first to last token over the gaps), wall time and output tokens/s. Each mode
serves one short warm-up request before the timed batch.

    python scripts/bench_workers.py                          # default model, print the table
    python scripts/bench_workers.py --markdown BENCHMARKS.md # and record it (BENCHMARKS.md, benchmarks/history/)
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import sys
import time

import bench_report
import ray

from decode_worker.actor import DecodeActor
from decode_worker.worker import DecodeWorkerConfig
from engine import EngineArgs, SamplingParams
from engine.model_source import resolve_model
from runtime.engine_bridge import sampling_spec
from router.control_client import ControlEndpoint, control_endpoint
from router.handoff import start_request
from wire.requests import GenerateRequest
from wire.push_pull import TokenStream
from prefill_worker.actor import PrefillActor
from prefill_worker.worker import PrefillWorkerConfig
from runtime.ray_group import start_worker_actor

MODES = ("colocated", "disaggregated")


def endpoint(handle) -> ControlEndpoint:
    """The worker's control socket, as the router reaches it (call on the event loop that uses it)."""
    return control_endpoint(ray.get(handle.control_address.remote()))


def workload(args) -> list[list[int]]:
    rng = random.Random(args.seed)
    return [[rng.randrange(10, 40000) for _ in range(rng.randint(args.min_prompt, args.max_prompt))]
            for _ in range(args.requests)]  # fmt: skip


def start_actors(mode: str, engine_args: EngineArgs, threads: int):
    if mode == "colocated":
        decode = start_worker_actor(DecodeActor, engine_args, DecodeWorkerConfig(local_prefill_threshold=10**9), threads)
        return decode, None, [decode]
    half = max(1, threads // 2)
    decode = start_worker_actor(DecodeActor, engine_args, DecodeWorkerConfig(), half)
    prefill = start_worker_actor(PrefillActor, engine_args, PrefillWorkerConfig(), half)
    return decode, prefill, [decode, prefill]


async def warm_up(stream: TokenStream, params, d_ep, p_ep, mode: str) -> None:
    """One short request first: first-forward costs (page faults, kernel set-up) stay out of the timings."""
    rid = f"{mode}-warm-up"
    await start_request(GenerateRequest(rid, tuple(range(10, 74)), params, stream.address), d_ep, p_ep)
    while not stream.finished(rid):
        stream.poll(5)


async def drive(mode: str, decode, prefill, stream: TokenStream, params, prompts):
    """Every prompt through the handoff, then the stream read to the end: (submit times, token arrivals, wall)."""
    d_ep, p_ep = endpoint(decode), endpoint(prefill) if prefill else None
    try:
        await warm_up(stream, params, d_ep, p_ep, mode)
        submitted, arrivals = {}, {}
        start = time.perf_counter()
        for i, prompt in enumerate(prompts):
            rid = f"{mode}-{i}"
            submitted[rid] = time.perf_counter()
            await start_request(GenerateRequest(rid, tuple(prompt), params, stream.address), d_ep, p_ep)
        while not all(stream.finished(rid) for rid in submitted):  # the stream's reader is synchronous
            for delta in stream.poll(5):
                if delta.token_ids:
                    arrivals.setdefault(delta.request_id, []).append(time.perf_counter())
        return submitted, arrivals, time.perf_counter() - start
    finally:
        for ep in (d_ep, p_ep):
            if ep is not None:
                ep.close()


def run_mode(mode: str, args, prompts) -> dict:
    engine_args = EngineArgs(model=args.model, max_model_len=1024, num_kv_blocks=args.kv_blocks)
    decode, prefill, actors = start_actors(mode, engine_args, args.threads)
    stream = TokenStream()
    params = sampling_spec(SamplingParams(temperature=0, max_tokens=args.output_tokens, ignore_eos=True))
    try:
        submitted, arrivals, wall = asyncio.run(drive(mode, decode, prefill, stream, params, prompts))
    finally:
        for actor in actors:
            ray.get(actor.shutdown.remote())
            ray.kill(actor, no_restart=True)
        stream.close()
    ttft = [arrivals[r][0] - submitted[r] for r in submitted]
    itl = [(a[-1] - a[0]) / (args.output_tokens - 1) for a in arrivals.values()]
    return {
        "mode": mode,
        "ttft_p50": statistics.median(ttft),
        "ttft_max": max(ttft),
        "itl_mean": statistics.mean(itl),
        "wall": wall,
        "tok_s": len(prompts) * args.output_tokens / wall,
    }


def table(rows: list[dict]) -> str:
    lines = ["| mode | TTFT p50 (s) | TTFT max (s) | ITL mean (ms) | wall (s) | output tok/s |", "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['mode']} | {r['ttft_p50']:.2f} | {r['ttft_max']:.2f} | {r['itl_mean'] * 1000:.0f} "
                     f"| {r['wall']:.1f} | {r['tok_s']:.1f} |")  # fmt: skip
    return "\n".join(lines)


def machine_line() -> str:
    return bench_report.machine_line(f"Ray {ray.__version__}")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default=None, help="model dir or name (default: SmolLM2-135M-Instruct)")
    p.add_argument("--requests", type=int, default=16)
    p.add_argument("--min-prompt", type=int, default=128)
    p.add_argument("--max-prompt", type=int, default=512)
    p.add_argument("--output-tokens", type=int, default=32)
    p.add_argument("--threads", type=int, default=2, help="torch threads in all (split between the two actors)")
    p.add_argument("--kv-blocks", type=int, default=1024)
    p.add_argument("--seed", type=int, default=0)
    bench_report.add_markdown_option(p)
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    args.model = str(resolve_model(args.model))
    prompts = workload(args)
    ray.init(address="local", num_cpus=4, _node_ip_address="127.0.0.1", include_dashboard=False,
             logging_level="WARNING", log_to_driver=False)  # fmt: skip
    try:
        rows = [run_mode(mode, args, prompts) for mode in MODES]
    finally:
        ray.shutdown()
    text = table(rows)
    print(text)
    if args.markdown:
        details = (
            f"{args.requests} requests of {args.min_prompt}-{args.max_prompt} random prompt tokens, "
            f"{args.output_tokens} greedy output tokens each, all started at once. Torch threads: colocated "
            f"actor {args.threads}, disaggregated {max(1, args.threads // 2)} per actor. "
            f"Model: `{os.path.basename(args.model)}`."
        )
        argv = argv if argv is not None else sys.argv[1:]
        record = bench_report.run_text("bench_workers.py", argv, machine_line(), details, text)
        bench_report.record_run(args.markdown, "bench_workers.py", record)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
