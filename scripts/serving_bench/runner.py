"""Drive the load: send each sample at its arrival time, at most `max_concurrency` in flight, with a progress bar."""

from __future__ import annotations

import asyncio
import contextlib
import time

import aiohttp
import numpy as np
from tqdm.asyncio import tqdm

from .client import RequestOutput, request_body, send_request
from .datasets import SampleRequest
from planner.workload import arrival_gaps

# A long run is not a hung one: the whole-request limit is generous, the connect limit is not.
TIMEOUT = aiohttp.ClientTimeout(total=6 * 3600, sock_connect=30)


async def fetch_model_id(base_url: str) -> str:
    """The first model the server lists, for when --model is not given."""
    async with aiohttp.ClientSession(timeout=TIMEOUT) as session, session.get(base_url + "/v1/models") as response:
        response.raise_for_status()
        return (await response.json())["data"][0]["id"]


async def run_load(base_url: str, endpoint: str, model: str, samples: list[SampleRequest], request_rate: float,
                   burstiness: float, max_concurrency: int | None, rng: np.random.Generator, ignore_eos: bool,
                   extra_body: dict, progress: bool = True) -> tuple[list[RequestOutput], float, float]:  # fmt: skip
    """Send every sample once; (outputs in sample order, perf_counter at the start, duration in s).

    The first sample is sent alone first (not counted) so a wrong URL or model fails at once, loudly.
    """
    connector = aiohttp.TCPConnector(limit=max_concurrency or 0)  # 0: no limit
    async with aiohttp.ClientSession(timeout=TIMEOUT, connector=connector) as session:
        bodies = [request_body(endpoint, model, s, ignore_eos, extra_body) for s in samples]
        probe = await send_request(session, base_url, endpoint, bodies[0], samples[0].prompt_len)
        if not probe.success:
            raise RuntimeError(f"the initial test request failed: {probe.error}")
        limit = asyncio.Semaphore(max_concurrency) if max_concurrency else None
        bar = tqdm(total=len(samples), disable=not progress, desc="requests")

        async def one(body: dict, prompt_len: int) -> RequestOutput:
            arrived = time.perf_counter()
            async with limit or contextlib.nullcontext():
                out = await send_request(session, base_url, endpoint, body, prompt_len)
            out.queue_time = out.start_time - arrived
            bar.update(1)
            return out

        tasks = []
        start = time.perf_counter()
        for body, sample, gap in zip(bodies, samples, arrival_gaps(rng, len(samples), request_rate, burstiness)):
            if gap > 0:
                await asyncio.sleep(gap)
            tasks.append(asyncio.create_task(one(body, sample.prompt_len)))
        outputs = await asyncio.gather(*tasks)
        duration = time.perf_counter() - start
        bar.close()
    return list(outputs), start, duration
