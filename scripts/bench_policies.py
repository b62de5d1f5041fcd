"""Routing decisions per second of each prefill policy's `pick`, on one core, no network.

Four prefill workers; prompts of about 2,000 tokens (a 1,536-token system
prompt from a set of `--groups`, then a 0-512-token user turn), and a second
workload of prompts that share nothing (every pick keys 125 new blocks and the
tree evicts as much). The caller's side of a dispatch is modelled as the
router does it: `in_flight` up at pick, down 16 requests later. Each policy
first routes the whole workload once untimed (cache_aware's tree fills up to
its cap), then routes it again timed, pick by pick. `block_keys` alone is
timed too: it is most of what cache_aware adds to round_robin.

    python scripts/bench_policies.py                          # print the table
    python scripts/bench_policies.py --markdown BENCHMARKS.md # and record it (BENCHMARKS.md, benchmarks/history/)
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from collections import deque

from bench_report import add_markdown_option, machine_line, record_run, run_text

from router.block_keys import block_keys
from router.policy import make_policy
from router.worker_state import WorkerState

POLICY_NAMES = ("round_robin", "least_loaded", "cache_aware")


def shared_prefix_prompts(args, rng: random.Random) -> list[list[int]]:
    systems = [[rng.randrange(args.vocab) for _ in range(args.system_tokens)] for _ in range(args.groups)]
    return [
        rng.choice(systems) + [rng.randrange(args.vocab) for _ in range(rng.randint(0, args.max_user_tokens))]
        for _ in range(args.prompts)
    ]


def unique_prompts(args, rng: random.Random) -> list[list[int]]:
    length = args.system_tokens + args.max_user_tokens // 2
    return [[rng.randrange(args.vocab) for _ in range(length)] for _ in range(args.prompts)]


def time_picks(name: str, prompts: list[list[int]], args) -> list[float]:
    """Seconds per pick, for the second pass over `prompts`."""
    policy = make_policy(name, **({"seed": 0} if name == "least_loaded" else {}))
    workers = [WorkerState(f"p{i}", "prefill") for i in range(args.workers)]
    in_flight: deque[WorkerState] = deque()
    seconds = []
    for timed in (False, True):
        for tokens in prompts:
            start = time.perf_counter()
            chosen = policy.pick(tokens, workers)
            if timed:
                seconds.append(time.perf_counter() - start)
            chosen.in_flight += 1
            in_flight.append(chosen)
            if len(in_flight) > 16:
                in_flight.popleft().in_flight -= 1
    return seconds


def time_keys(prompts: list[list[int]]) -> list[float]:
    seconds = []
    for tokens in prompts:
        start = time.perf_counter()
        block_keys(tokens, 16)
        seconds.append(time.perf_counter() - start)
    return seconds


def row(label: str, workload: str, seconds: list[float]) -> str:
    cuts = statistics.quantiles(seconds, n=100)
    return (f"| {label} | {workload} | {len(seconds) / sum(seconds):,.0f} | {cuts[49] * 1e6:.1f} "
            f"| {cuts[98] * 1e6:.1f} |")  # fmt: skip


def table(args) -> str:
    rng = random.Random(args.seed)
    workloads = {"shared prefix": shared_prefix_prompts(args, rng), "unique": unique_prompts(args, rng)}
    lines = ["| what | prompts | picks/s | p50 (µs) | p99 (µs) |", "|---|---|---|---|---|"]
    for workload, prompts in workloads.items():
        lines.append(row("`block_keys` alone", workload, time_keys(prompts)))
        for name in POLICY_NAMES:
            lines.append(row(f"`{name}`", workload, time_picks(name, prompts, args)))
    return "\n".join(lines)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--prompts", type=int, default=4000)
    p.add_argument("--groups", type=int, default=32, help="distinct system prompts in the shared-prefix workload")
    p.add_argument("--system-tokens", type=int, default=1536)
    p.add_argument("--max-user-tokens", type=int, default=512)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--seed", type=int, default=0)
    add_markdown_option(p)
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    text = table(args)
    print(text)
    if args.markdown:
        details = (
            f"{args.workers} prefill workers, {args.prompts} prompts per workload of "
            f"{args.system_tokens}-{args.system_tokens + args.max_user_tokens} tokens "
            f"({args.groups} system prompts in the shared-prefix one), block size 16; "
            f"round_robin is the baseline: a pick that reads nothing of the prompt."
        )
        argv = argv if argv is not None else sys.argv[1:]
        record = run_text("bench_policies.py", argv, machine_line(), details, text)
        record_run(args.markdown, "bench_policies.py", record)
    return 0


if __name__ == "__main__":
    sys.exit(main())
