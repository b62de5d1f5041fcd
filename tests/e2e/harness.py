"""Driving prefill and decode workers through the real handoff, hosted in-process or on Ray."""

from __future__ import annotations

import time

from engine import SamplingParams
from runtime.engine_bridge import sampling_spec
from router.handoff import EncodedCalls, HandoffTimeouts, start_request
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


class LoopEndpoint:
    """A worker hosted in this process (`runtime.hosting.HostedWorker`), called like a remote one:
    each call goes through its loop as the router's do."""

    def __init__(self, hosted):
        self.hosted = hosted

    def reserve(self, request):
        return self.hosted.call("reserve", request)

    def prefill(self, task) -> None:
        self.hosted.call("prefill", task)

    def abort(self, request_id: str) -> None:
        self.hosted.call("abort", request_id)


def ray_endpoint(handle) -> EncodedCalls:
    import ray

    return EncodedCalls(lambda method, payload: ray.get(getattr(handle, method).remote(payload)))


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
