"""scripts/bench_serving.py run as a user runs it, against a live router with tiny-model workers on local Ray."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from engine import EngineArgs
from router.config import RouterConfig
from tests.e2e.router_cluster import CHAT_TEMPLATE, router_on_ray

ROOT = Path(__file__).resolve().parents[2]
MODEL = "tiny-llama"
NUM_PROMPTS, OUTPUT_LEN = 8, 6
# The keys of `vllm bench serve --save-result --save-detailed` (0.32, text generation) that a run fills.
VLLM_KEYS = {
    "date", "endpoint_type", "backend", "label", "model_id", "tokenizer_id", "num_prompts", "request_rate",
    "burstiness", "max_concurrency", "duration", "completed", "failed", "total_input_tokens", "total_output_tokens",
    "request_throughput", "request_goodput", "output_throughput", "total_token_throughput", "input_lens",
    "output_lens", "ttfts", "itls", "latencies", "start_times", "queue_times", "generated_texts", "errors",
    "max_output_tokens_per_s", "max_concurrent_requests",
}  # fmt: skip


@pytest.fixture(scope="module")
def served(ray_session, tiny_model_dirs):
    model_dir = tiny_model_dirs["llama"]
    args = EngineArgs(model=model_dir, num_kv_blocks=64, max_model_len=256, dtype="float32")
    config = RouterConfig(model_dir, MODEL, max_model_len=256, chat_template=CHAT_TEMPLATE)
    with router_on_ray(ray_session, args, config) as stack:
        yield stack.server.url, model_dir


def _bench(url: str, model_dir: str, result_dir: Path, *flags: str) -> dict:
    cmd = [sys.executable, str(ROOT / "scripts" / "bench_serving.py"), "--base-url", url, "--tokenizer", model_dir,
           "--num-prompts", str(NUM_PROMPTS), "--max-concurrency", "4", "--ignore-eos", "--seed", "3",
           "--save-result", "--save-detailed", "--plot", "--result-dir", str(result_dir),
           "--result-filename", "run.json", "--disable-tqdm", *flags]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=240, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Serving Benchmark Result" in done.stdout
    return json.loads((result_dir / "run.json").read_text())


def _check_counts(result: dict) -> None:
    assert VLLM_KEYS <= set(result), VLLM_KEYS - set(result)
    assert all(len(result[k]) == NUM_PROMPTS for k in VLLM_KEYS if isinstance(result[k], list))
    assert result["completed"] + result["failed"] == result["num_prompts"] == NUM_PROMPTS
    assert result["failed"] == 0 and result["errors"] == [""] * NUM_PROMPTS
    assert result["total_input_tokens"] == sum(result["input_lens"])
    assert result["total_output_tokens"] == sum(result["output_lens"])
    assert result["output_throughput"] == pytest.approx(result["total_output_tokens"] / result["duration"])
    assert result["total_token_throughput"] == pytest.approx(
        (result["total_input_tokens"] + result["total_output_tokens"]) / result["duration"])
    assert result["request_throughput"] == pytest.approx(NUM_PROMPTS / result["duration"])
    assert 1 <= result["max_concurrent_requests"] <= 4
    # One ITL per text chunk after the first: never more than one per token.
    assert all(len(itl) <= n - 1 for itl, n in zip(result["itls"], result["output_lens"]))


def test_random_completions_json_counts_and_plots(served, tmp_path):
    url, model_dir = served
    result = _bench(url, model_dir, tmp_path, "--dataset-name", "random", "--random-input-len", "24",
                    "--random-output-len", str(OUTPUT_LEN), "--percentile-metrics", "ttft,tpot,itl,e2el",
                    "--metric-percentiles", "50,99", "--goodput", "ttft:600000", "tpot:600000")  # fmt: skip
    assert result["model_id"] == MODEL  # from /v1/models: no --model given
    assert (result["backend"], result["request_rate"], result["max_concurrency"]) == ("openai", "inf", 4)
    _check_counts(result)
    assert result["output_lens"] == [OUTPUT_LEN] * NUM_PROMPTS  # ignore_eos: exactly as asked
    assert result["input_lens"] == [24] * NUM_PROMPTS
    assert result["request_goodput"] == pytest.approx(result["request_throughput"])  # every request meets a 10 min SLO
    for metric in ("ttft", "tpot", "itl", "e2el"):
        for stat in ("mean", "median", "std", "p50", "p99"):
            assert result[f"{stat}_{metric}_ms"] >= 0, (stat, metric)
        assert result[f"p50_{metric}_ms"] <= result[f"p99_{metric}_ms"]
    assert result["median_e2el_ms"] >= result["median_ttft_ms"] > 0
    for plot in ("run_latency_cdf.png", "run_throughput.png"):
        assert (tmp_path / plot).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", plot


def test_shared_prefix_chat_with_poisson_arrivals(served, tmp_path):
    url, model_dir = served
    result = _bench(url, model_dir, tmp_path, "--model", MODEL, "--endpoint", "/v1/chat/completions",
                    "--dataset-name", "prefix-repetition", "--prefix-repetition-num-prefixes", "2",
                    "--prefix-repetition-prefix-len", "32", "--prefix-repetition-suffix-len", "8",
                    "--prefix-repetition-output-len", str(OUTPUT_LEN), "--request-rate", "20")  # fmt: skip
    assert result["request_rate"] == 20 and result["request_goodput"] is None
    _check_counts(result)
    assert result["output_lens"] == [OUTPUT_LEN] * NUM_PROMPTS
    assert "p99_ttft_ms" in result and "p99_e2el_ms" not in result  # vLLM's default metrics: ttft, tpot, itl
