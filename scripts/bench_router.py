"""What the router adds: routing decisions/s, and HTTP request rate and latency with workers that answer at once.

Stub workers are the real control plane with stub worker objects behind it: each
runs in its own process, on a real worker loop behind the real `ControlService` on
an I/O thread (the calls of the decode and prefill actors), so the router calls them
over the same ZMQ control sockets as real workers, and tokens come back over the
real token stream (TokenDeltas pushed over ZMQ). Decode reserves at once,
prefill pushes the first token and the final delta at once. So what is measured
is the router alone. Three measurements, same run:

  decisions   `WorkerRegistry.pick_prefill` + `pick_decode` in a loop (policy and decode choice, no I/O)
  direct      baseline: the handoff (`start_request`) and the token stream driven straight at the
              stubs from one event loop, no router, no HTTP
  router      POST /v1/completions (text prompt, non-streaming) to the router, served by uvicorn in its
              own process(es), from an aiohttp client; added latency = router p50/p99 - direct p50/p99

Each is run at concurrency 1 (latency) and `--concurrency` (throughput).

    python scripts/bench_router.py                          # print the table
    python scripts/bench_router.py --markdown BENCHMARKS.md # and record it (BENCHMARKS.md, benchmarks/history/)
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

import bench_report

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests.tiny_models, from a checkout

from decode_worker.actor import DECODE_CALLS
from router.control_client import control_endpoint
from router.handoff import start_request
from wire.requests import DecodeReservation, GenerateRequest, PrefillTask, SamplingSpec, TokenDelta, WorkerLoad
from wire.push_pull import Pushers
from prefill_worker.actor import PREFILL_CALLS
from router.policy import make_policy
from router.registry import WorkerRegistry
from router.token_stream import TokenStreamConsumer
from runtime.control_service import ControlService
from runtime.io_thread import IOThread
from runtime.load_board import LoadBoard
from runtime.loop import CallsOnlyWorker, WorkerLoop

PROMPT = "The quick brown fox jumps over the lazy dog."


class StubDecode(CallsOnlyWorker):
    """Reserves every request at once; the stub prefill does the streaming."""

    load = WorkerLoad("decode-0", 0, 0, 0, 1000, 1000, 0.0)

    def reserve(self, request: GenerateRequest) -> DecodeReservation:
        return DecodeReservation(request.request_id, False, "tcp://127.0.0.1:1", "tcp://127.0.0.1:1", (0,), 0)

    def abort(self, request_id: str) -> None:
        pass


class StubPrefill(StubDecode):
    """Streams `max_tokens` tokens at once: the first alone (as prefill does), the rest with the final delta."""

    load = WorkerLoad("prefill-0", 0, 0, 0, 1000, 1000, 0.0)

    def __init__(self):
        self.pushers = Pushers()

    def prefill(self, task: PrefillTask) -> None:
        req = task.request
        n, rid, to = req.sampling.max_tokens, req.request_id, req.stream_address
        self.pushers.send(to, TokenDelta(rid, 0, (100,)))
        rest = tuple(100 + i % 200 for i in range(1, n))
        self.pushers.send(to, TokenDelta(rid, 1, rest, True, "length", len(req.prompt_token_ids), n, 0))


def serve_stub(role: str) -> None:
    """Child process: one stub worker on a worker loop behind a control socket; prints its address, runs until killed."""
    worker, calls = (StubDecode(), DECODE_CALLS) if role == "decode" else (StubPrefill(), PREFILL_CALLS)
    board = LoadBoard(f"{role}-0")
    loop = WorkerLoop(f"{role}-0", board, lambda deliver: worker)
    io = IOThread(f"{role}-0-io", lambda io: [ControlService(board, calls, loop.post, io.post)])
    print(io.services[0].address, flush=True)
    sys.stdin.read()  # until the parent closes our stdin


def start_stub(role: str) -> tuple[subprocess.Popen, str]:
    child = subprocess.Popen([sys.executable, __file__, "--serve-stub", role], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)  # fmt: skip
    return child, child.stdout.readline().strip()


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


async def bench_direct(addresses, prompt_ids, max_tokens, requests, concurrency):
    stream = TokenStreamConsumer()
    await stream.start()
    decode_ep, prefill_ep = control_endpoint(addresses["decode"]), control_endpoint(addresses["prefill"])
    sampling = SamplingSpec(temperature=0.0, max_tokens=max_tokens)

    async def one(i):
        rid = f"direct-{concurrency}-{i}"
        outputs = stream.open(rid)
        await start_request(GenerateRequest(rid, prompt_ids, sampling, stream.address), decode_ep, prefill_ep)
        async for _ in outputs.chunks():
            pass
        stream.close_request(rid)

    await _closed_loop(one, min(200, requests), concurrency)  # warm-up
    result = await _closed_loop(one, requests, concurrency)
    await stream.close()
    return result


async def bench_http(url, model, max_tokens, requests, concurrency, pids):
    """Latencies, requests/s, and CPU µs per request of each process in `pids` (name -> pid; "client": this one)."""
    # aiohttp (C HTTP parser): a lighter client than httpx, which would eat much of the 2 shared cores itself.
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(base_url=url, connector=connector) as client:
        body = {"model": model, "prompt": PROMPT, "max_tokens": max_tokens, "temperature": 0}

        async def one(_):
            async with client.post("/v1/completions", json=body) as response:
                assert response.status == 200, await response.text()
                await response.read()

        await _closed_loop(one, min(200, requests), concurrency)  # warm-up
        before = _cpu_seconds(pids)
        latencies, rate = await _closed_loop(one, requests, concurrency)
        after = _cpu_seconds(pids)
        return latencies, rate, {name: (after[name] - before[name]) / requests * 1e6 for name in pids}


def _cpu_seconds(pids: dict[str, int]) -> dict[str, float]:
    """User + system CPU seconds so far of each process (Linux /proc)."""
    ticks, out = os.sysconf("SC_CLK_TCK"), {}
    for name, pid in pids.items():
        fields = open(f"/proc/{pid}/stat").read().rpartition(")")[2].split()
        out[name] = (int(fields[11]) + int(fields[12])) / ticks  # utime, stime
    return out


def serve_router(decode_address: str, prefill_address: str, model_dir: str, port: int) -> None:
    """Child process: the router app on uvicorn, its workers the stubs at these control addresses."""
    from router.app import create_app
    from router.config import RouterConfig
    from router.server import serve

    config = RouterConfig(model_dir, "bench", port=port, max_in_flight=4096)
    app = create_app(config)
    app.state.router.registry.register("prefill-0", "prefill", control_endpoint(prefill_address))
    app.state.router.registry.register("decode-0", "decode", control_endpoint(decode_address))
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
    bench_report.add_markdown_option(parser)
    parser.add_argument("--serve-router", nargs=3, help=argparse.SUPPRESS)
    parser.add_argument("--serve-stub", choices=("decode", "prefill"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_stub:
        return serve_stub(args.serve_stub)
    if args.serve_router:
        return serve_router(*args.serve_router, args.port)

    model_dir = args.model
    if model_dir is None:
        from tests.tiny_models import build_tiny_model

        model_dir = str(build_tiny_model(tempfile.mkdtemp(prefix="bench-router-"), "llama"))
    stubs = {role: start_stub(role) for role in ("decode", "prefill")}
    addresses = {role: address for role, (_, address) in stubs.items()}
    from transformers import AutoTokenizer

    prompt_ids = tuple(AutoTokenizer.from_pretrained(model_dir)(PROMPT)["input_ids"])
    rows = [("routing decisions (policy + decode choice, no I/O)", f"{bench_decisions():,.0f} decisions/s", "", "")]
    child = subprocess.Popen([sys.executable, __file__, "--serve-router", addresses["decode"], addresses["prefill"],
                              model_dir, "--port", str(args.port)])  # fmt: skip
    pids = {"router": child.pid, "decode stub": stubs["decode"][0].pid, "prefill stub": stubs["prefill"][0].pid,
            "client": os.getpid()}  # fmt: skip
    try:
        url = f"http://127.0.0.1:{args.port}"
        _wait_ready(url)
        for concurrency in (1, args.concurrency):
            n = args.requests if concurrency > 1 else min(args.requests, 1000)
            direct, direct_rate = asyncio.run(bench_direct(addresses, prompt_ids, args.max_tokens, n, concurrency))
            routed, routed_rate, cpu = asyncio.run(bench_http(url, "bench", args.max_tokens, n, concurrency, pids))
            rows.append((f"direct (baseline), concurrency {concurrency}", f"{direct_rate:,.0f} req/s",
                         f"{_pct(direct, 50):.2f}", f"{_pct(direct, 99):.2f}"))  # fmt: skip
            rows.append((f"through the router (HTTP), concurrency {concurrency}", f"{routed_rate:,.0f} req/s",
                         f"{_pct(routed, 50):.2f}", f"{_pct(routed, 99):.2f}"))  # fmt: skip
            rows.append((f"added by the router, concurrency {concurrency}", "",
                         f"{_pct(routed, 50) - _pct(direct, 50):+.2f}", f"{_pct(routed, 99) - _pct(direct, 99):+.2f}"))  # fmt: skip
            rows.append((f"CPU per HTTP request, concurrency {concurrency}",
                         ", ".join(f"{name} {us:,.0f} µs" for name, us in cpu.items()), "", ""))  # fmt: skip
    finally:
        child.terminate()
        child.wait(30)
        for stub, _ in stubs.values():
            stub.stdin.close()
            stub.wait(30)
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
        bench_report.record_run(args.markdown, "bench_router.py", text)


if __name__ == "__main__":
    main()
