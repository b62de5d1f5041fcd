"""scripts/bench_cluster.py run as a user runs it: a quick sweep of disaggregated (1P+1D) against colocated
(2 decode workers prefilling their own prompts, started from a spec with no prefill pool) on a tiny model, each
run with `tandem simulate`'s prediction beside it (priced by a hand-made profile: calibrating one for the
tiny model would take minutes)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.planner.profiles import hand_profile

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ("1P+1D cache_aware", "2 colocated cache_aware")
NUM_PROMPTS = 4  # sweeps.QUICK.mixed_prompts


def test_quick_mixed_sweep_writes_table_json_plots_and_predictions(tiny_model_dirs, tmp_path):
    markdown = tmp_path / "BENCH.md"
    markdown.write_text("# earlier content\n")
    hand_profile().save(tmp_path / "profile.json")
    cmd = [sys.executable, str(ROOT / "scripts" / "bench_cluster.py"), "--quick", "--sweeps", "mixed",
           "--model", tiny_model_dirs["llama"], "--max-model-len", "256", "--num-kv-blocks", "64",
           "--profile", str(tmp_path / "profile.json"), "--result-dir", str(tmp_path / "out"),
           "--markdown", str(markdown)]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-4000:]

    rows = json.loads((tmp_path / "out" / "results.json").read_text())["rows"]["mixed"]
    assert [r["config"] for r in rows] == list(CONFIGS)
    for row in rows:  # every request served, in both layouts, and the counts add up
        assert (row["completed"], row["failed"], row["num_prompts"]) == (NUM_PROMPTS, 0, NUM_PROMPTS)
        assert row["total_output_tokens"] == sum(row["output_lens"]) > 0
        assert row["total_input_tokens"] == sum(row["input_lens"])
        assert row["request_goodput"] == pytest.approx(row["request_throughput"])  # the quick SLOs are a minute: all meet them
        assert 0 <= row["prefix_hit_rate"] < 1  # from the router's /metrics
        predicted = row["predicted"]  # the same layout and load, simulated: every request, its keys as measured
        assert predicted["completed"] == NUM_PROMPTS and predicted["mean_ttft_ms"] > 0 and predicted["p99_tpot_ms"] > 0
        for plot in ("latency_cdf", "throughput"):
            assert (tmp_path / "out" / f"mixed-{_slug(row['config'])}_{plot}.png").stat().st_size > 0

    text = markdown.read_text()
    assert text.startswith("# earlier content\n")  # a file without the script's section gets one at its end
    assert len(list((tmp_path / "benchmarks" / "history").glob("*-bench_cluster.md"))) == 1  # the full record
    assert "## Cluster sweeps" in text and "python scripts/bench_cluster.py --quick" in text
    for config in CONFIGS:
        row = next(line for line in text.splitlines() if line.startswith(f"| {config} |"))
        assert row.endswith(f"| {NUM_PROMPTS} / 0 |")
    assert text.count("- target ") == 2  # TPOT p99 and goodput, each with its ratio and verdict
    assert "Measured / predicted by `tandem simulate`" in text
    assert text.count(f"| {CONFIGS[0]} |") == 2  # its measured row and its predicted one
    assert (tmp_path / "out" / "mixed.png").read_bytes()[:4] == b"\x89PNG"


def _slug(label: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in label).strip("_")
