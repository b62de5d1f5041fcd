"""What the router adds: routing decisions/s, and HTTP request rate and latency with workers that answer at once.

Stub workers are Ray actors speaking the real worker protocol (msgpack bytes in
`reserve` / `prefill` / `abort` / `load`, TokenDeltas pushed over ZMQ): decode
reserves at once, prefill pushes the first token and the final delta at once.
So what is measured is the router alone. Three measurements, same run:

  decisions   `WorkerRegistry.pick_prefill` + `pick_decode` in a loop (policy and decode choice, no I/O)
  direct      baseline: the handoff (`start_request_async`) and the token stream driven straight at the
              stubs from one event loop, no router, no HTTP
  router      POST /v1/completions (text prompt, non-streaming) to the router, served by uvicorn in its
              own process, from an aiohttp client; added latency = router p50/p99 - direct p50/p99

Each is run at concurrency 1 (latency) and `--concurrency` (throughput).

    python scripts/bench_router.py                          # print the table
    python scripts/bench_router.py --markdown BENCHMARKS.md # and append it
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

import aiohttp
import httpx
import ray

from kvtransfer.codec import decode, encode
from kvtransfer.handoff import AsyncEncodedCalls, start_request_async
from kvtransfer.protocol import DecodeReservation, GenerateRequest, PrefillTask, SamplingSpec, TokenDelta, WorkerLoad
from router.policy import make_policy
from router.registry import WorkerRegistry
from router.token_stream import TokenStreamConsumer

NAMESPACE = "bench-router"
PROMPT = "The quick brown fox jumps over the lazy dog."


class StubDecode:
    """Reserves every request at once; the stub prefill does the streaming."""

    def reserve(self, payload: bytes) -> bytes:
        request = decode(payload, GenerateRequest)
        return encode(DecodeReservation(request.request_id, False, "tcp://127.0.0.1:1", "tcp://127.0.0.1:1", (0,), 0))

    def abort(self, request_id: str) -> None:
        pass

    def load(self, _=None) -> bytes:
        return encode(WorkerLoad("decode-0", 0, 0, 0, 1000, 1000, 0.0))


class StubPrefill:
    """Streams `max_tokens` tokens at once: the first alone (as prefill does), the rest with the final delta."""

    def __init__(self):
        from kvtransfer.token_stream import Pushers

        self.pushers = Pushers()

    def prefill(self, payload: bytes) -> None:
        req = decode(payload, PrefillTask).request
        n, rid, to = req.sampling.max_tokens, req.request_id, req.stream_address
        self.pushers.send(to, TokenDelta(rid, 0, (100,)))
        rest = tuple(100 + i % 200 for i in range(1, n))
        self.pushers.send(to, TokenDelta(rid, 1, rest, True, "length", len(req.prompt_token_ids), n, 0))

    def abort(self, request_id: str) -> None:
        pass

    def load(self, _=None) -> bytes:
        return encode(WorkerLoad("prefill-0", 0, 0, 0, 1000, 1000, 0.0))


def _remote(handle) -> AsyncEncodedCalls:
    return AsyncEncodedCalls(lambda method, payload: getattr(handle, method).remote(payload))


def bench_decisions(seconds: float = 1.0) -> float:
    registry = WorkerRegistry(make_policy("round_robin"))
    for i in range(4):
        registry.register(f"prefill-{i}", "prefill", None)
        registry.register(f"decode-{i}", "decode", None)
    tokens, n, start = list(range(64)), 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        for _ in range(1000):
            registry.pick_prefill(tokens), registry.pick_decode(tokens)
        n += 1000
    return n / (time.perf_counter() - start)


async def _closed_loop(one_request, requests: int, concurrency: int) -> tuple[list[float], float]:
    """Latencies (s) and requests/s of `requests` calls, `concurrency` at a time."""
    latencies: list[float] = []
    todo = iter(range(requests))

    async def client():
        for i in todo:
            t0 = time.perf_counter()
            await one_request(i)
            latencies.append(time.perf_counter() - t0)

    start = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(concurrency)))
    return latencies, requests / (time.perf_counter() - start)


async def bench_direct(decode_h, prefill_h, prompt_ids, max_tokens, requests, concurrency):
    stream = TokenStreamConsumer()
    await stream.start()
    decode_ep, prefill_ep = _remote(decode_h), _remote(prefill_h)
    sampling = SamplingSpec(temperature=0.0, max_tokens=max_tokens)

    async def one(i):
        rid = f"direct-{concurrency}-{i}"
        outputs = stream.open(rid)
        await start_request_async(GenerateRequest(rid, prompt_ids, sampling, stream.address), decode_ep, prefill_ep)
        async for _ in outputs.chunks():
            pass
        stream.close_request(rid)

    await _closed_loop(one, min(200, requests), concurrency)  # warm-up
    result = await _closed_loop(one, requests, concurrency)
    await stream.close()
    return result


async def bench_http(url, model, max_tokens, requests, concurrency):
    # aiohttp (C HTTP parser): a lighter client than httpx, which would eat much of the 2 shared cores itself.
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(base_url=url, connector=connector) as client:
        body = {"model": model, "prompt": PROMPT, "max_tokens": max_tokens, "temperature": 0}

        async def one(_):
            async with client.post("/v1/completions", json=body) as response:
                assert response.status == 200, await response.text()
                await response.read()

        await _closed_loop(one, min(200, requests), concurrency)  # warm-up
        return await _closed_loop(one, requests, concurrency)


def serve_router(gcs: str, model_dir: str, port: int) -> None:
    """Child process: the router app on uvicorn, its workers the named stub actors."""
    from router.app import create_app
    from router.config import RouterConfig
    from router.server import serve

    ray.init(address=gcs, namespace=NAMESPACE, logging_level="WARNING", log_to_driver=False)
    config = RouterConfig(model_dir, "bench", port=port, max_in_flight=4096)
    app = create_app(config)
    app.state.router.registry.register("prefill-0", "prefill", _remote(ray.get_actor("prefill-0")))
    app.state.router.registry.register("decode-0", "decode", _remote(ray.get_actor("decode-0")))
    serve(app, config)


def _pct(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1] * 1e3 if len(values) > 1 else values[0] * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="a model directory (its tokenizer); default: a tiny test model")
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=4)
    parser.add_argument("--port", type=int, default=18431)
    parser.add_argument("--markdown", help="append the results to this file")
    parser.add_argument("--serve-router", nargs=2, metavar=("GCS", "MODEL_DIR"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_router:
        return serve_router(*args.serve_router, args.port)

    model_dir = args.model
    if model_dir is None:
        from tests.tiny_models import build_tiny_model

        model_dir = str(build_tiny_model(tempfile.mkdtemp(prefix="bench-router-"), "llama"))
    ctx = ray.init(address="local", num_cpus=2, namespace=NAMESPACE, include_dashboard=False,
                   logging_level="WARNING", log_to_driver=False, _node_ip_address="127.0.0.1")  # fmt: skip
    decode_h = ray.remote(StubDecode).options(name="decode-0", num_cpus=0).remote()
    prefill_h = ray.remote(StubPrefill).options(name="prefill-0", num_cpus=0).remote()
    from transformers import AutoTokenizer

    prompt_ids = tuple(AutoTokenizer.from_pretrained(model_dir)(PROMPT)["input_ids"])
    rows = [("routing decisions (policy + decode choice, no I/O)", f"{bench_decisions():,.0f} decisions/s", "", "")]
    child = subprocess.Popen([sys.executable, __file__, "--serve-router", ctx.address_info["gcs_address"], model_dir,
                              "--port", str(args.port)])  # fmt: skip
    try:
        url = f"http://127.0.0.1:{args.port}"
        _wait_ready(url)
        for concurrency in (1, args.concurrency):
            n = args.requests if concurrency > 1 else min(args.requests, 1000)
            direct, direct_rate = asyncio.run(bench_direct(decode_h, prefill_h, prompt_ids, args.max_tokens, n, concurrency))
            routed, routed_rate = asyncio.run(bench_http(url, "bench", args.max_tokens, n, concurrency))
            rows.append((f"direct (baseline), concurrency {concurrency}", f"{direct_rate:,.0f} req/s",
                         f"{_pct(direct, 50):.2f}", f"{_pct(direct, 99):.2f}"))  # fmt: skip
            rows.append((f"through the router (HTTP), concurrency {concurrency}", f"{routed_rate:,.0f} req/s",
                         f"{_pct(routed, 50):.2f}", f"{_pct(routed, 99):.2f}"))  # fmt: skip
            rows.append((f"added by the router, concurrency {concurrency}", "",
                         f"{_pct(routed, 50) - _pct(direct, 50):+.2f}", f"{_pct(routed, 99) - _pct(direct, 99):+.2f}"))  # fmt: skip
    finally:
        child.terminate()
        child.wait(30)
        ray.shutdown()
    report(args, rows)


def _wait_ready(url: str, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/health").status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    raise RuntimeError("the router did not become ready")


def report(args, rows) -> None:
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    lines = [
        f"### `python scripts/bench_router.py {' '.join(sys.argv[1:])}`",
        "",
        f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, commit {commit}, "
        f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores (shared), "
        f"{args.max_tokens} output tokens per request, text prompt of {len(PROMPT)} characters, "
        f"load average at the end {os.getloadavg()[0]:.1f}.",
        "",
        "| measurement | rate | p50 ms | p99 ms |",
        "|---|---|---|---|",
        *[f"| {a} | {b} | {c} | {d} |" for a, b, c, d in rows],
        "",
    ]
    text = "\n".join(lines)
    print(text)
    if args.markdown:
        with open(args.markdown, "a") as f:
            f.write("\n" + text)


if __name__ == "__main__":
    main()
