"""Driving prefill and decode workers through the real handoff over their control sockets, hosted in-process or on Ray."""

from __future__ import annotations

import asyncio
import threading
import time

from engine import SamplingParams
from router import handoff
from router.control_client import control_endpoint
from router.handoff import HandoffTimeouts
from runtime.hosting import HostedWorker
from runtime.engine_bridge import sampling_spec
from wire.requests import GenerateRequest
from wire.push_pull import StreamedRequest, TokenStream

GREEDY = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
_BASE = [(13 * i + 7) % 380 + 3 for i in range(120)]
SHARED = _BASE[:40]
# Mixed lengths (block size 16): tiny, exactly one block, shared prefixes, several blocks.
PROMPTS = {
    "tiny": _BASE[60:63],
    "one-block": _BASE[70:86],
    "shared-a": SHARED + [5, 6, 7],
    "shared-b": SHARED + _BASE[90:110],
    "long": list(reversed(_BASE[:75])),
    "mid": _BASE[20:45],
}


class Driver:
    """The router's side of the handoff for a synchronous test: each worker is called over its control
    socket, as `tandem serve`'s router calls it, from an event loop on a thread of its own."""

    def __init__(self):
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="test-router-loop", daemon=True)
        self._thread.start()
        self._endpoints: list = []

    def run(self, coro):
        """Run `coro` on the driver's loop; its result (or exception) here."""
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def endpoint(self, worker) -> "Endpoint":
        """`worker`: a hosted worker (`runtime.hosting.HostedWorker`) or a Ray actor handle of a rank 0."""
        address = worker.worker.control_address if isinstance(worker, HostedWorker) else _ray_control_address(worker)

        async def connect():
            return control_endpoint(address)

        endpoint = Endpoint(self, self.run(connect()))
        self._endpoints.append(endpoint)
        return endpoint

    def close(self) -> None:
        async def close_all():
            for endpoint in self._endpoints:
                endpoint.calls.close()

        self.run(close_all())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)


class Endpoint:
    """A worker's `ControlEndpoint` (`calls`, async, on the driver's loop), callable from the test's thread."""

    def __init__(self, driver: Driver, calls):
        self.driver, self.calls = driver, calls

    def reserve(self, request):
        return self.driver.run(self.calls.reserve(request))

    def prefill(self, task) -> None:
        self.driver.run(self.calls.prefill(task))

    def abort(self, request_id: str) -> None:
        self.driver.run(self.calls.abort(request_id))

    def load(self):
        return self.driver.run(self.calls.load())


def _ray_control_address(handle) -> str:
    import ray

    return ray.get(handle.control_address.remote())


def start_request(request, decode: Endpoint, prefill: Endpoint | None, timeouts=HandoffTimeouts()):
    """The router's handoff (`router.handoff.start_request`) for these workers; its reservation."""
    return decode.driver.run(handoff.start_request(request, decode.calls, prefill and prefill.calls, timeouts))


def abort_request(request_id: str, decode: Endpoint, prefill: Endpoint | None) -> None:
    decode.driver.run(handoff.abort_request(request_id, decode.calls, prefill and prefill.calls))


def request(request_id: str, prompt, stream: TokenStream, params: SamplingParams = GREEDY) -> GenerateRequest:
    return GenerateRequest(request_id, tuple(prompt), sampling_spec(params), stream.address)


def wait_for(condition, what: str, timeout_s: float = 60.0, stream: TokenStream | None = None) -> None:
    """Poll until `condition()`; fail (never hang) after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        if stream is not None:
            stream.poll(10)
        else:
            time.sleep(0.01)


def run_requests(stream: TokenStream, prompts: dict, pick, params=GREEDY, timeouts=HandoffTimeouts()):
    """Start every request (pick(i) -> (decode endpoint, prefill endpoint or None)), then read the stream."""
    reservations = {}
    for i, (request_id, prompt) in enumerate(prompts.items()):
        decode_ep, prefill_ep = pick(i)
        reservations[request_id] = start_request(request(request_id, prompt, stream, params), decode_ep, prefill_ep,
                                                 timeouts)  # fmt: skip
    wait_for(lambda: all(stream.finished(r) for r in prompts), "every request to finish", stream=stream)
    results: dict[str, StreamedRequest] = {r: stream.requests[r] for r in prompts}
    return results, reservations
