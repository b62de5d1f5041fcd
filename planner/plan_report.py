"""What `tandem plan` prints and writes: the table of layouts, the recommended one as a cluster spec, and a
plot of goodput against request rate for the best layouts."""

from __future__ import annotations

from typing import Callable, Sequence

from planner.layout import Layout
from planner.plan import Evaluation, Plan, evaluate
from planner.search import WorkerKind
from planner.slo import SLO
from planner.workload import SimRequest


def table(plan: Plan, limit: int = 20) -> str:
    """Markdown: each layout's predicted latencies (ms), throughput, goodput and whether it meets the SLO."""
    head = ("| layout | devices | $/h | TTFT p50 / p90 / p99 | TPOT p50 / p90 / p99 | ITL p99 | out tok/s | goodput "
            "req/s | per device | per $ | meets SLO |")  # fmt: skip
    rows = [head, "|---" * 11 + "|"]
    for e in plan.evaluations[:limit]:
        r = e.result
        price = f"{e.price_per_hour:.2f}" if e.price_per_hour else "–"
        per_dollar = f"{e.goodput_per_dollar_hour:.0f}" if e.goodput_per_dollar_hour is not None else "–"
        meets = "yes" if e.meets else "no: " + "; ".join(e.misses)
        rows.append(f"| {e.layout.describe()} | {e.devices} | {price} | {_ms3(r, 'ttft')} | {_ms3(r, 'tpot')} | "
                    f"{r['p99_itl_ms']:.0f} | {r['output_throughput']:.1f} | {e.goodput:.3f} | "
                    f"{e.goodput_per_device:.3f} | {per_dollar} | {meets} |")  # fmt: skip
    if len(plan.evaluations) > limit:
        rows.append(f"| ... {len(plan.evaluations) - limit} more layouts | | | | | | | | | | |")
    return "\n".join(rows)


def _ms3(result: dict, metric: str) -> str:
    return " / ".join(f"{result[f'p{p}_{metric}_ms']:.0f}" for p in (50, 90, 99))


def spec_of(layout: Layout, kinds: Sequence[WorkerKind]) -> dict:
    """The layout as a cluster spec (`tandem serve --config`): pools, their sizes and what each rank asks for.

    GPU pools ask for one GPU per rank and a custom resource named after the device type, which the Ray
    nodes of that type must offer (`ray start --resources '{"H100-SXM": 8}'`) when types are mixed."""
    by_profile = {id(k.profile): k for k in kinds}
    spec: dict = {"engine": {"max_num_batched_tokens": layout.engine.max_num_batched_tokens,
                             "max_num_seqs": layout.engine.max_num_seqs}}  # fmt: skip
    for role, pool in (("prefill", layout.prefill), ("decode", layout.decode)):
        if not pool.replicas:
            spec[role] = {"replicas": 0}
            continue
        kind = by_profile[id(pool.profile)]
        entry: dict = {"replicas": pool.replicas, "tensor_parallel_size": pool.profile.tp_size}
        if kind.unit == "core":
            entry["torch_threads"] = kind.devices
        else:
            entry.update(num_gpus=1, resources={pool.profile.device: 1})
        spec[role] = entry
    return spec


def goodput_curves(evaluations: Sequence[Evaluation], kinds: Sequence[WorkerKind], slo: SLO,
                   requests_at: Callable[[float], list[SimRequest]], rates: Sequence[float]) -> dict[str, list[float]]:  # fmt: skip
    """Each layout's goodput (req/s) at each request rate."""
    return {e.layout.describe(): [evaluate(e.layout, kinds, requests_at(rate), slo)[0].goodput for rate in rates]
            for e in evaluations}  # fmt: skip


def plot(curves: dict[str, list[float]], rates: Sequence[float], path: str, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    for name, goodputs in curves.items():
        ax.plot(rates, goodputs, marker="o", label=name)
    ax.plot(rates, rates, linestyle=":", color="grey", label="offered load")
    ax.set_xlabel("request rate (req/s)")
    ax.set_ylabel("goodput (req/s within the SLO)")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
