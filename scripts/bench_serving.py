"""Load generator for any OpenAI-compatible server (Tandem's router, vLLM, SGLang), in `vllm bench serve` terms.

Streams every request (`stream_options.include_usage` for exact output token counts), sends
them as Poisson / gamma arrivals at --request-rate (inf: all at once) under --max-concurrency,
and reports TTFT, TPOT, ITL, E2EL, request and token throughput and goodput, with the flag
names, metric names and result JSON keys of vLLM's benchmark.

    python scripts/bench_serving.py --base-url http://127.0.0.1:8000 --model M --tokenizer DIR \\
        --dataset-name random --random-input-len 128 --random-output-len 64 --num-prompts 16 \\
        --max-concurrency 16 --ignore-eos --save-result --plot --result-dir results/
    ... --dataset-name prefix-repetition --prefix-repetition-num-prefixes 4 --prefix-repetition-prefix-len 256 \\
        --prefix-repetition-suffix-len 32 --prefix-repetition-output-len 64
    ... --dataset-name sharegpt --dataset-path ShareGPT_V3_unfiltered_cleaned_split.json
    ... --goodput ttft:500 tpot:100 --percentile-metrics ttft,tpot,itl,e2el --metric-percentiles 50,90,99
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from serving_bench import datasets, plots  # noqa: E402
from serving_bench.client import CHAT, COMPLETIONS  # noqa: E402
from planner.bench_metrics import (  # noqa: E402
    METRICS, compute_metrics, metric_values, parse_goodput, per_second, percentile_key)
from serving_bench.runner import fetch_model_id, run_load  # noqa: E402


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backend", default="openai", help="a label for the result (vLLM: openai, openai-chat, ...)")
    p.add_argument("--base-url", help="http://host:port (overrides --host/--port)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--endpoint", default=COMPLETIONS, choices=[COMPLETIONS, CHAT])
    p.add_argument("--model", help="the served model name (default: the first of /v1/models)")
    p.add_argument("--tokenizer", help="tokenizer directory or hub id (default: --model)")
    p.add_argument("--dataset-name", default="random", choices=["random", "prefix-repetition", "sharegpt"])
    p.add_argument("--dataset-path", help="ShareGPT-format JSON (--dataset-name sharegpt)")
    p.add_argument("--num-prompts", type=int, default=1000)
    p.add_argument("--request-rate", type=float, default=float("inf"), help="requests/s; inf sends all at once")
    p.add_argument("--burstiness", type=float, default=1.0, help="gamma shape of the arrival gaps; 1 is Poisson")
    p.add_argument("--max-concurrency", type=int, help="requests in flight at most")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--ignore-eos", action="store_true", help="send ignore_eos so outputs are as long as asked")
    p.add_argument("--random-input-len", type=int, default=1024)
    p.add_argument("--random-output-len", type=int, default=128)
    p.add_argument("--random-range-ratio", type=float, default=0.0, help="lengths uniform in len*(1 -/+ ratio)")
    p.add_argument("--prefix-repetition-prefix-len", type=int, default=256, help="shared (system) prompt tokens")
    p.add_argument("--prefix-repetition-suffix-len", type=int, default=256, help="per-prompt (question) tokens")
    p.add_argument("--prefix-repetition-num-prefixes", type=int, default=10, help="groups sharing a prefix")
    p.add_argument("--prefix-repetition-output-len", type=int, default=128)
    p.add_argument("--sharegpt-output-len", type=int, help="output length instead of each reply's")
    p.add_argument("--percentile-metrics", default="ttft,tpot,itl", help=f"comma-separated of {','.join(METRICS)}")
    p.add_argument("--metric-percentiles", default="99", help="comma-separated percentiles, e.g. 25,50,99")
    p.add_argument("--goodput", nargs="+", metavar="NAME:MS", help="SLOs: ttft:MS tpot:MS e2el:MS")
    p.add_argument("--save-result", action="store_true", help="write the result JSON")
    p.add_argument("--save-detailed", action="store_true", help="keep per-request lists (ttfts, itls, ...) in it")
    p.add_argument("--result-dir", default=".")
    p.add_argument("--result-filename")
    p.add_argument("--label", help="a label for the result and its file name (default: --backend)")
    p.add_argument("--plot", action="store_true", help="PNG latency CDFs and throughput over time next to the JSON")
    p.add_argument("--disable-tqdm", action="store_true")
    p.add_argument("--extra-body", type=json.loads, default={}, help="JSON merged into every request body")
    args = p.parse_args(argv)
    args.base_url = (args.base_url or f"http://{args.host}:{args.port}").rstrip("/")
    args.metrics = [m.strip() for m in args.percentile_metrics.split(",") if m.strip()]
    if unknown := set(args.metrics) - set(METRICS):
        p.error(f"--percentile-metrics: unknown {sorted(unknown)}")
    args.percentiles = [float(x) for x in args.metric_percentiles.split(",")]
    try:
        args.slos = parse_goodput(args.goodput)
    except ValueError as e:
        p.error(str(e))
    return args


def make_samples(args, tokenizer) -> list[datasets.SampleRequest]:
    rng = np.random.default_rng(args.seed)
    if args.dataset_name == "random":
        return datasets.random_requests(rng, tokenizer, args.num_prompts, args.random_input_len,
                                        args.random_output_len, args.random_range_ratio)  # fmt: skip
    if args.dataset_name == "prefix-repetition":
        return datasets.prefix_repetition_requests(
            rng, tokenizer, args.num_prompts, args.prefix_repetition_prefix_len, args.prefix_repetition_suffix_len,
            args.prefix_repetition_num_prefixes, args.prefix_repetition_output_len)  # fmt: skip
    if not args.dataset_path:
        raise SystemExit("--dataset-name sharegpt needs --dataset-path")
    return datasets.sharegpt_requests(rng, tokenizer, args.dataset_path, args.num_prompts, args.sharegpt_output_len)


def print_summary(args, result: dict) -> None:
    rows = [("Successful requests:", result["completed"]), ("Failed requests:", result["failed"]),
            ("Benchmark duration (s):", result["duration"]), ("Total input tokens:", result["total_input_tokens"]),
            ("Total generated tokens:", result["total_output_tokens"]),
            ("Request throughput (req/s):", result["request_throughput"]),
            ("Output token throughput (tok/s):", result["output_throughput"]),
            ("Total token throughput (tok/s):", result["total_token_throughput"])]  # fmt: skip
    if result["request_goodput"] is not None:
        rows.append(("Request goodput (req/s):", result["request_goodput"]))
    for metric in args.metrics:
        rows += [(f"Mean {metric.upper()} (ms):", result[f"mean_{metric}_ms"]),
                 (f"Median {metric.upper()} (ms):", result[f"median_{metric}_ms"]),
                 *[(f"P{k[1:].split('_')[0]} {metric.upper()} (ms):", result[k])
                   for k in (percentile_key(metric, p) for p in args.percentiles)]]  # fmt: skip
    print("{:=^52}".format(" Serving Benchmark Result "))
    for name, value in rows:
        print(f"{name:<40} {value:<10.2f}" if isinstance(value, float) else f"{name:<40} {value:<10}")
    print("=" * 52)


def main(argv=None) -> dict:
    args = parse_args(argv)
    from transformers import AutoTokenizer

    model = args.model or asyncio.run(fetch_model_id(args.base_url))
    tokenizer_id = args.tokenizer or model
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_id)
    samples = make_samples(args, tokenizer)
    outputs, t0, duration = asyncio.run(run_load(
        args.base_url, args.endpoint, model, samples, args.request_rate, args.burstiness, args.max_concurrency,
        np.random.default_rng(args.seed + 1), args.ignore_eos, args.extra_body, not args.disable_tqdm))  # fmt: skip
    # The server's usage count when it sent one, else the generated text re-tokenized (as vLLM does).
    output_lens = [(o.output_tokens or len(tokenizer.encode(o.generated_text, add_special_tokens=False)))
                   if o.success else 0 for o in outputs]  # fmt: skip
    metrics = compute_metrics(outputs, output_lens, duration, t0, args.slos, args.metrics, args.percentiles)
    print_summary(args, metrics)
    now = datetime.datetime.now()
    result = {"date": now.strftime("%Y%m%d-%H%M%S"), "endpoint_type": args.backend, "backend": args.backend,
              "label": args.label, "model_id": model, "tokenizer_id": tokenizer_id, "num_prompts": args.num_prompts,
              "request_rate": args.request_rate if args.request_rate != float("inf") else "inf",
              "burstiness": args.burstiness, "max_concurrency": args.max_concurrency, **metrics}  # fmt: skip
    # Kept always, as vLLM keeps them; the other per-request lists only with --save-detailed.
    result.update(latencies=[o.latency for o in outputs], queue_times=[o.queue_time for o in outputs])
    if args.save_detailed:
        result.update(input_lens=[o.prompt_len for o in outputs], output_lens=output_lens,
                      ttfts=[o.ttft for o in outputs], itls=[o.itl for o in outputs],
                      start_times=[o.start_time - t0 for o in outputs],
                      generated_texts=[o.generated_text for o in outputs], errors=[o.error for o in outputs])  # fmt: skip
    if args.save_result or args.plot:
        save(args, result, outputs, output_lens, t0, duration)
    return result


def save(args, result: dict, outputs, output_lens, t0: float, duration: float) -> None:
    rate = "inf" if args.request_rate == float("inf") else args.request_rate
    concurrency = f"-concurrency{args.max_concurrency}" if args.max_concurrency else ""
    name = args.result_filename or (f"{args.label or args.backend}-{rate}qps{concurrency}-"
                                    f"{Path(result['model_id']).name}-{result['date']}.json")  # fmt: skip
    path = Path(args.result_dir) / name
    path.parent.mkdir(parents=True, exist_ok=True)
    if args.save_result:
        path.write_text(json.dumps(result))
        print(f"result: {path}")
    if args.plot:
        latencies = metric_values(outputs, output_lens)
        label = f"{args.label or args.backend}, {result['model_id']}"
        stem = path.with_suffix("")
        cdf = plots.latency_cdfs(Path(f"{stem}_latency_cdf.png"), latencies, label)
        tput = plots.throughput_over_time(Path(f"{stem}_throughput.png"), *per_second(outputs, output_lens, t0, duration),
                                          label)  # fmt: skip
        print(f"plots: {cdf} {tput}")


if __name__ == "__main__":
    main()
