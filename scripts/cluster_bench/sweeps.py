"""What bench_cluster.py runs: workloads (bench_serving.py flags), Tandem configurations, and the sweeps pairing them.

A sweep is one table: one workload run against each of its configurations
(plus vLLM with --with-vllm). Configurations that several sweeps share are
started once and run every workload asked of them (`deployments`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass


@dataclass(frozen=True)
class Workload:
    name: str
    description: str
    flags: tuple[str, ...]  # bench_serving.py flags (dataset, lengths, rate, seed, SLOs)


@dataclass(frozen=True)
class Config:
    """One Tandem layout. num_prefill 0: colocated (decode workers prefill their own prompts)."""

    num_prefill: int
    num_decode: int
    routing_policy: str = "cache_aware"
    torch_threads: int = 1  # per worker

    @property
    def label(self) -> str:
        threads = f", {self.torch_threads} threads each" if self.torch_threads != 1 else ""
        layout = f"{self.num_decode} colocated" if self.num_prefill == 0 else f"{self.num_prefill}P+{self.num_decode}D"
        return f"{layout} {self.routing_policy}{threads}"

    @property
    def cores(self) -> int:
        return (self.num_prefill + self.num_decode) * self.torch_threads


@dataclass(frozen=True)
class Sweep:
    name: str
    title: str
    workload: Workload
    configs: tuple[Config, ...]
    targets: tuple[tuple[str, str, str, str, float], ...] = ()  # (metric, config label, baseline label, op, bound)


@dataclass(frozen=True)
class Sizes:
    """Everything that scales a run: the full run's sizes fit 15 minutes on 2 cores with SmolLM2-135M."""

    mixed_prompts: int
    mixed_input: int
    mixed_output: int
    mixed_rate: float
    slo_ttft_ms: int
    slo_tpot_ms: int
    prefix_prompts: int
    prefix_groups: int
    prefix_len: int
    question_len: int
    prefix_output: int
    prefix_rate: float
    ratio_prompts: int
    ratio_input: int
    ratio_output: int
    ratio_rate: float
    serving_prompts: int = 16
    serving_input: int = 128
    serving_output: int = 64


# Rates for a quiet 2-core machine: one torch thread prefills ~450 SmolLM2 tokens/s, so the single prefill
# worker of 1P+1D runs ~60% busy on the mixed load and each colocated worker spends ~30% of its time prefilling.
FULL = Sizes(mixed_prompts=16, mixed_input=1024, mixed_output=128, mixed_rate=0.25, slo_ttft_ms=10000,
             slo_tpot_ms=100, prefix_prompts=36, prefix_groups=12, prefix_len=1024, question_len=32, prefix_output=16,
             prefix_rate=2.0, ratio_prompts=24, ratio_input=384, ratio_output=96, ratio_rate=1.0)  # fmt: skip
QUICK = Sizes(mixed_prompts=4, mixed_input=48, mixed_output=8, mixed_rate=8.0, slo_ttft_ms=60000, slo_tpot_ms=60000,
              prefix_prompts=4, prefix_groups=2, prefix_len=32, question_len=8, prefix_output=4, prefix_rate=8.0,
              ratio_prompts=4, ratio_input=32, ratio_output=8, ratio_rate=8.0, serving_prompts=4, serving_input=32,
              serving_output=8)  # fmt: skip

DISAGGREGATED = Config(1, 1)
COLOCATED = Config(0, 2)


def scaled(s: Sizes, rate_scale: float) -> Sizes:
    """Every request rate times `rate_scale` (a slower or busier machine: < 1)."""
    return dataclasses.replace(s, mixed_rate=s.mixed_rate * rate_scale, prefix_rate=s.prefix_rate * rate_scale,
                               ratio_rate=s.ratio_rate * rate_scale)  # fmt: skip


def sweeps(s: Sizes, only: tuple[str, ...] = ()) -> list[Sweep]:
    mixed = Workload(
        "mixed", f"random, {s.mixed_input} ±50% in / {s.mixed_output} ±50% out, {s.mixed_prompts} prompts, "
        f"Poisson {s.mixed_rate:g} req/s; SLO TTFT {s.slo_ttft_ms} ms, TPOT {s.slo_tpot_ms} ms",
        ("--dataset-name", "random", "--random-input-len", str(s.mixed_input), "--random-output-len",
         str(s.mixed_output), "--random-range-ratio", "0.5", "--num-prompts", str(s.mixed_prompts),
         "--request-rate", str(s.mixed_rate), "--seed", "11", "--goodput", f"ttft:{s.slo_ttft_ms}",
         f"tpot:{s.slo_tpot_ms}"))  # fmt: skip
    prefix = Workload(
        "shared_prefix", f"prefix-repetition, {s.prefix_groups} system prompts of {s.prefix_len} tokens, "
        f"{s.prefix_prompts // s.prefix_groups} {s.question_len}-token questions each, {s.prefix_output} out, "
        f"Poisson {s.prefix_rate:g} req/s",
        ("--dataset-name", "prefix-repetition", "--prefix-repetition-num-prefixes", str(s.prefix_groups),
         "--prefix-repetition-prefix-len", str(s.prefix_len), "--prefix-repetition-suffix-len", str(s.question_len),
         "--prefix-repetition-output-len", str(s.prefix_output), "--num-prompts", str(s.prefix_prompts),
         "--request-rate", str(s.prefix_rate), "--seed", "12"))  # fmt: skip
    ratio = Workload(
        "ratio", f"random, {s.ratio_input} in / {s.ratio_output} out, {s.ratio_prompts} prompts, "
        f"Poisson {s.ratio_rate:g} req/s; SLO TTFT {s.slo_ttft_ms} ms, TPOT {s.slo_tpot_ms} ms",
        ("--dataset-name", "random", "--random-input-len", str(s.ratio_input), "--random-output-len",
         str(s.ratio_output), "--num-prompts", str(s.ratio_prompts), "--request-rate", str(s.ratio_rate),
         "--seed", "13", "--goodput", f"ttft:{s.slo_ttft_ms}", f"tpot:{s.slo_tpot_ms}"))  # fmt: skip
    serving = Workload(
        "serving", f"random, {s.serving_input} in / {s.serving_output} out, {s.serving_prompts} prompts all at once "
        f"(max concurrency {s.serving_prompts})",
        ("--dataset-name", "random", "--random-input-len", str(s.serving_input), "--random-output-len",
         str(s.serving_output), "--num-prompts", str(s.serving_prompts), "--max-concurrency", str(s.serving_prompts),
         "--seed", "14"))  # fmt: skip
    policies = tuple(Config(2, 1, p) for p in ("cache_aware", "least_loaded", "round_robin"))
    every = [
        Sweep("mixed", "Disaggregated against colocated, equal workers and cores", mixed, (DISAGGREGATED, COLOCATED),
              (("p99_tpot_ms", DISAGGREGATED.label, COLOCATED.label, "<=", 1 / 3),
               ("request_goodput", DISAGGREGATED.label, COLOCATED.label, ">=", 1.5))),  # fmt: skip
        Sweep("routing", "Routing policies on a shared-prefix workload (2 prefill + 1 decode)", prefix, policies,
              (("mean_ttft_ms", policies[0].label, policies[2].label, "<=", 1 / 2),)),
        Sweep("ratio", "Prefill:decode ratio at a fixed request rate", ratio, (Config(1, 1), Config(2, 1), Config(1, 2))),
        Sweep("serving", "Two cores, three ways (the serving gap to vLLM)", serving,
              (DISAGGREGATED, Config(0, 1, torch_threads=2), COLOCATED)),
    ]
    return [s for s in every if not only or s.name in only]


def deployments(chosen: list[Sweep]) -> dict[Config, list[Sweep]]:
    """Each distinct configuration once, with the sweeps (workloads) to run against it, in first-seen order."""
    plan: dict[Config, list[Sweep]] = {}
    for sweep in chosen:
        for config in sweep.configs:
            plan.setdefault(config, []).append(sweep)
    return plan
