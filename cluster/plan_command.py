"""`tandem plan`: the layouts within a budget simulated under one workload, a recommendation for an SLO.

    tandem plan --slo ttft_p90=2s,tpot_p90=100ms [--device h100:2.5 --device l40s:0.9 | --plan-profile F ...]
        [--max-devices 8] [vllm bench serve's workload flags | --trace FILE] [--output-spec best.yaml]
        [--plot goodput.png]

Worker kinds: GPUs from their published figures (`--device`, at each of `--tp-sizes`), profile files, or
(neither) this machine's CPU at every thread count its cores allow (`planner.local_profile`).
"""

from __future__ import annotations

import argparse
import math
import sys

from cluster.cli import add_spec_flags, spec_from_args
from cluster.plan_cli import add_workload_flags, progress, published, workload_of, workload_spec


def add_plan_parser(sub) -> None:
    p = sub.add_parser("plan", help="simulate colocated and disaggregated layouts within a budget; recommend one for an SLO")
    add_spec_flags(p)
    p.add_argument("--device", action="append", default=[],
                   help="plan pools of this GPU from its published figures: h100, h200, a100, l40s; NAME:PRICE gives "
                        "its price per device-hour (repeat for several types; default: this machine's CPU)")
    p.add_argument("--plan-profile", action="append", default=[], help="a profile JSON to plan with (repeatable)")
    p.add_argument("--tp-sizes", default="1,2,4,8", help="with --device: tensor-parallel sizes to weigh")
    p.add_argument("--max-devices", type=int, help="the budget: GPUs (--device) or CPU cores (default: 8 GPUs, or "
                   "this machine's cores)")
    p.add_argument("--slo", required=True, help="bounds like ttft_p90=2s,tpot_p90=100ms,itl_p99=300ms")
    p.add_argument("--colocated-only", action="store_true", help="weigh no disaggregated layout")
    p.add_argument("--output-spec", help="write the recommended layout here as a cluster spec YAML (tandem serve --config)")
    p.add_argument("--plot", help="write a PNG of goodput against request rate for the best layouts")
    p.add_argument("--plot-rates", help="request rates of the plot (default: the workload's rate x 0.25 ... x 4)")
    p.add_argument("--refresh-profile", action="store_true", help="measure this machine's profiles again")
    add_workload_flags(p)


def run_plan(args: argparse.Namespace) -> None:
    from planner.plan import make_plan
    from planner.plan_report import table
    from planner.slo import SLO

    slo = SLO.parse(args.slo)
    for flag in ("num_prefill", "num_decode", "tensor_parallel_size", "torch_threads"):
        if getattr(args, flag) is not None:
            raise ValueError(f"--{flag.replace('_', '-')}: `tandem plan` chooses the layout; `tandem simulate` takes one")
    spec = spec_from_args(args)
    kinds, budget = worker_kinds(args, spec)
    requests, caveats = workload_of(args, kinds[0].profile.model.vocab_size)
    from cluster.layout_profiles import engine_limits, router_knobs

    engine, router = engine_limits(spec), router_knobs(spec)
    plan = make_plan(kinds, requests, slo, budget, args.max_concurrency, not args.colocated_only,
                     on_layout=lambda e: print(f"tandem: simulated {e.layout.describe()}", file=sys.stderr, flush=True),
                     engine=engine, router=router)  # fmt: skip
    print(f"tandem: plan for {slo} within {budget} {kinds[0].unit}(s); {len(plan.evaluations)} layouts simulated in "
          f"{plan.wall_s:.1f} s ({plan.steps / max(plan.wall_s, 1e-9):,.0f} steps/s)")  # fmt: skip
    for caveat in caveats:
        print(f"tandem: note: {caveat}")
    print(table(plan))
    recommend(plan, kinds, args)
    if args.plot:
        plot_plan(plan, kinds, args, slo)


def worker_kinds(args: argparse.Namespace, spec) -> tuple[list, int]:
    """The worker kinds to plan with, and the budget in their unit."""
    from costmodel import Profile
    from planner.search import WorkerKind

    if args.device or args.plan_profile:
        kinds = []
        for path in args.plan_profile:
            profile = Profile.load(path)
            cpu = profile.torch_threads is not None
            kinds.append(WorkerKind(profile, profile.torch_threads if cpu else profile.tp_size, "core" if cpu else "GPU"))
        for item in args.device:
            name, _, price = item.partition(":")
            for tp in (int(t) for t in args.tp_sizes.split(",")):
                try:
                    profile = published(name, spec.model, tp, float(price) if price else None)
                except ValueError as err:
                    if "unknown device" in str(err):
                        raise
                    print(f"tandem: note: {err}; not weighed", file=sys.stderr)
                    continue
                kinds.append(WorkerKind(profile, tp, "GPU"))
        if not kinds:
            raise ValueError("no worker kind left to plan with (the model fits none of the devices)")
        if len({k.unit for k in kinds}) > 1:
            raise ValueError("plan GPUs or this machine's CPU cores, not both in one budget")
        return kinds, args.max_devices or 8
    from cluster.layout import Machines
    from cluster.layout_profiles import engine_limits
    from planner.local_profile import LocalWorker, local_profile

    cores = int(Machines.this_machine().local_cpus)
    budget = args.max_devices or cores
    dtype = spec.decode.dtype
    kinds = [WorkerKind(local_profile(LocalWorker(spec.model, dtype, t, engine_limits(spec)), args.refresh_profile,
                                      on_progress=progress), t, "core") for t in range(1, min(budget, cores) + 1)]  # fmt: skip
    return kinds, budget


def recommend(plan, kinds, args: argparse.Namespace) -> None:
    import yaml

    from cluster.spec import parse_spec
    from planner.plan_report import spec_of

    best = plan.best
    if best is None:
        closest = plan.evaluations[0]
        print(f"tandem: no layout within {plan.budget} meets the SLO; the closest: {closest.layout.describe()} "
              f"({'; '.join(closest.misses)})")  # fmt: skip
        return
    spec = spec_of(best.layout, kinds)
    parse_spec(spec)  # what it writes, `tandem serve --config` takes
    objective = "goodput per dollar" if plan.by_price else "goodput per device"
    print(f"tandem: recommended ({objective}): {best.layout.describe()}\n" + yaml.safe_dump(spec, sort_keys=False))
    if args.output_spec:
        with open(args.output_spec, "w") as f:
            f.write(f"# tandem plan: {plan.slo}; {best.layout.describe()}\n" + yaml.safe_dump(spec, sort_keys=False))


def plot_plan(plan, kinds, args: argparse.Namespace, slo) -> None:
    from planner.plan_report import goodput_curves, plot
    from planner.workload import SimRequest, vllm_arrival_times

    requests, _ = workload_of(args, kinds[0].profile.model.vocab_size)
    base = args.request_rate if math.isfinite(args.request_rate) else 1.0
    rates = ([float(r) for r in args.plot_rates.split(",")] if args.plot_rates
             else [base * f for f in (0.25, 0.5, 1, 2, 4)])  # fmt: skip

    vocab_size = kinds[0].profile.model.vocab_size
    draws = () if args.trace else workload_spec(args).global_token_draws()  # as vLLM's client at each rate

    def requests_at(rate: float):
        times = vllm_arrival_times(args.seed, len(requests), rate, args.burstiness, draws, vocab_size)
        return [SimRequest(t, r.prompt, r.output_len) for r, t in zip(sorted(requests, key=lambda r: r.arrival_s), times)]

    best_of = {}
    for e in plan.evaluations:  # the best colocated and disaggregated layouts, and the recommended one
        best_of.setdefault("colocated" if e.layout.colocated else "disaggregated", e)
    shown = list({id(e): e for e in [plan.evaluations[0], *best_of.values()]}.values())
    curves = goodput_curves(shown, kinds, slo, requests_at, rates)
    plot(curves, rates, args.plot, f"goodput within {slo}")
    print(f"tandem: wrote {args.plot}")
