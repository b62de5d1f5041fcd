"""bench_cluster.py's output: one Markdown table per sweep (with its targets checked) and a bar chart per sweep.

A row is a bench_serving.py result dict plus `config` (the row label), `prefix_hit_rate` (from the
server's /metrics, None when it has none) and, for Tandem's rows, `predicted`: `tandem simulate`'s result for
the same layout and load (`cluster_bench.predict`).
"""

from __future__ import annotations

import operator
from pathlib import Path

from .predict import COMPARED, error
from .sweeps import Sweep

COLUMNS = (  # (header, result key, format)
    ("output tok/s", "output_throughput", "{:.1f}"),
    ("req/s", "request_throughput", "{:.2f}"),
    ("goodput req/s", "request_goodput", "{:.2f}"),
    ("TTFT mean / p50 / p99 ms", ("mean_ttft_ms", "median_ttft_ms", "p99_ttft_ms"), "{:.0f}"),
    ("TPOT p50 / p99 ms", ("median_tpot_ms", "p99_tpot_ms"), "{:.1f}"),
    ("ITL p99 ms", "p99_itl_ms", "{:.1f}"),
    ("prefix hit rate", "prefix_hit_rate", "{:.1%}"),
    ("done / failed", ("completed", "failed"), "{}"),
)
OPS = {"<=": operator.le, ">=": operator.ge}


def _cell(row: dict, keys, fmt: str) -> str:
    keys = keys if isinstance(keys, tuple) else (keys,)
    values = [row.get(k) for k in keys]
    return " / ".join("–" if v is None else fmt.format(v) for v in values)


def table(rows: list[dict]) -> list[str]:
    lines = ["| configuration | " + " | ".join(h for h, _, _ in COLUMNS) + " |",
             "|---" * (len(COLUMNS) + 1) + "|"]  # fmt: skip
    for row in rows:
        lines.append(f"| {row['config']} | " + " | ".join(_cell(row, k, f) for _, k, f in COLUMNS) + " |")
    return lines


def prediction_table(rows: list[dict]) -> list[str]:
    """Measured against predicted for the rows the model priced: each cell "measured / predicted (error)"."""
    priced = [r for r in rows if r.get("predicted")]
    if not priced:
        return []
    lines = ["Measured / predicted by `tandem simulate` (error):", "",
             "| configuration | " + " | ".join(h for _, h in COMPARED) + " |", "|---" * (len(COMPARED) + 1) + "|"]
    for row in priced:
        lines.append(f"| {row['config']} | " + " | ".join(_compared(row, key) for key, _ in COMPARED) + " |")
    return lines


def _compared(row: dict, key: str) -> str:
    real, pred = row.get(key), row["predicted"].get(key)
    fmt = "{:.2f}" if key == "request_goodput" else "{:.0f}" if key.endswith("ttft_ms") else "{:.1f}"
    cells = ["–" if v is None else fmt.format(v) for v in (real, pred)]
    err = error(pred, real)
    return f"{cells[0]} / {cells[1]}" + ("" if err is None else f" ({err:+.0%})")


def check_targets(sweep: Sweep, rows: list[dict]) -> list[str]:
    """One line per target: the measured ratio against its bound, met or not (missing rows say so)."""
    by_label = {r["config"]: r for r in rows}
    lines = []
    for metric, label, baseline, op, bound in sweep.targets:
        ours, theirs = by_label.get(label, {}).get(metric), by_label.get(baseline, {}).get(metric)
        target = f"{metric} of {label} {op} {bound:.2f}x {baseline}"
        if not ours or not theirs:
            lines.append(f"- target {target}: not measurable ({ours} against {theirs})")
            continue
        ratio = ours / theirs
        verdict = "**met**" if OPS[op](ratio, bound) else "**not met**"
        lines.append(f"- target {target}: {ratio:.2f}x ({ours:.2f} against {theirs:.2f}): {verdict}")
    return lines


def section(sweep: Sweep, rows: list[dict], engine: dict) -> list[str]:
    knobs = ", ".join(f"{k}={v}" for k, v in engine.items() if v is not None) or "the defaults"
    return [f"### {sweep.title}", "", f"Workload `{sweep.workload.name}`: {sweep.workload.description}. "
            f"Engine (Tandem and vLLM alike): {knobs}.", "", *table(rows), "", *check_targets(sweep, rows),
            *(["", *prediction] if (prediction := prediction_table(rows)) else [])]  # fmt: skip


def bar_chart(path: Path, sweep: Sweep, rows: list[dict]) -> Path:
    """TTFT mean / p99 and TPOT p99 per configuration, side by side."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = (("TTFT ms", ("mean_ttft_ms", "p99_ttft_ms")), ("TPOT ms", ("median_tpot_ms", "p99_tpot_ms")),
              ("output tok/s", ("output_throughput",)))  # fmt: skip
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 4))
    labels = [r["config"] for r in rows]
    for ax, (title, keys) in zip(axes, panels):
        width = 0.8 / len(keys)
        for i, key in enumerate(keys):
            xs = [j + i * width for j in range(len(rows))]
            ax.bar(xs, [r.get(key) or 0 for r in rows], width, label=key.removesuffix("_ms"))
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(rows))], labels, rotation=20, ha="right", fontsize=7)
        ax.set_title(title)
        ax.legend(fontsize=7)
    fig.suptitle(f"{sweep.title} ({sweep.workload.name})", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
