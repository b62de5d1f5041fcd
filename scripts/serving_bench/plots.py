"""PNG plots of a run, written next to its JSON: latency CDFs and throughput over time (matplotlib, no display)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only: no display on a server
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402


def _cdf(ax, values_ms: list[float], title: str) -> None:
    ax.set_title(title)
    ax.set_xlabel("ms")
    ax.set_ylabel("fraction of requests" if title != "ITL" else "fraction of gaps")
    ax.grid(alpha=0.3)
    if values_ms:
        xs = np.sort(values_ms)
        ax.step(xs, np.arange(1, len(xs) + 1) / len(xs), where="post")


def latency_cdfs(path: Path, latencies_s: dict[str, list[float]], label: str) -> Path:
    """One panel per metric (name -> seconds), each the empirical CDF in ms."""
    fig, axes = plt.subplots(1, len(latencies_s), figsize=(4 * len(latencies_s), 3.5), squeeze=False)
    for ax, (name, values) in zip(axes[0], latencies_s.items()):
        _cdf(ax, [v * 1000 for v in values], name.upper())
    fig.suptitle(f"Latency CDFs: {label}")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def throughput_over_time(path: Path, tokens_per_s, running, label: str) -> Path:
    """Output tokens/s in each second of the run, and requests in flight (right axis)."""
    fig, ax = plt.subplots(figsize=(8, 3.5))
    seconds = np.arange(len(tokens_per_s))
    ax.bar(seconds, tokens_per_s, width=0.9, align="edge", label="output tokens/s")
    ax.set_xlabel("seconds since the first request")
    ax.set_ylabel("output tokens/s")
    twin = ax.twinx()
    twin.step(seconds, running, where="post", color="tab:orange", label="requests in flight")
    twin.set_ylabel("requests in flight")
    ax.set_title(f"Throughput over time: {label}")
    handles = ax.get_legend_handles_labels()[0] + twin.get_legend_handles_labels()[0]
    ax.legend(handles, [h.get_label() for h in handles], loc="lower center", fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
