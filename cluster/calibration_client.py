"""The serving calibration's client: token-id prompts streamed from a real `tandem serve`, each request's
outcome as its client saw it (arrival, tokens' times) and the phases the server reported for it.

    outcome = one(server, prompt(256, seed=1), max_tokens=32)     # server: (completions URL, model name)
    outcomes = drive(server, requests)                             # each SimRequest at its arrival time
"""

from __future__ import annotations

import json
import random
import threading
import time
import urllib.request
from dataclasses import dataclass, field

from planner.workload import SimRequest


@dataclass
class Outcome:
    """One request as our client saw it (`planner.bench_metrics.RequestOutput`'s fields), with its phases."""

    prompt_len: int
    start_time: float = 0.0
    success: bool = False
    ttft: float = 0.0
    latency: float = 0.0
    itl: list[float] = field(default_factory=list)
    phases: dict = field(default_factory=dict)

    def token_times(self) -> list[float]:
        """When each token arrived (the client's clock); none if the request failed."""
        if not self.success:
            return []
        times = [self.start_time + self.ttft]
        for gap in self.itl:
            times.append(times[-1] + gap)
        return times

    def prefill_window(self) -> tuple[float, float] | None:
        """When its prompt was prefilled, on the client's clock (the worker's `prefill_s` ending with the first
        token); None without phases."""
        prefill = self.phases.get("prefill_s") if self.success else None
        return (self.start_time + self.ttft - prefill, self.start_time + self.ttft) if prefill else None


def prompt(n: int, seed: int, vocab_size: int = 32000) -> list[int]:
    """`n` ordinary token ids (away from the special ones at the vocabulary's start), the same for the same
    seed (a new seed: no prefix any worker has cached)."""
    rng = random.Random(1000 + seed)
    low, high = min(1000, vocab_size // 4), min(30000, vocab_size - 1)
    return [rng.randrange(low, high) for _ in range(n)]


def drive(server: tuple[str, str], requests: list[SimRequest]) -> list[Outcome]:
    """Each request sent at its arrival time (a thread each), streamed; their outcomes in order."""
    outcomes: list[Outcome | None] = [None] * len(requests)
    start = time.monotonic()

    def send(i: int, request: SimRequest) -> None:
        time.sleep(max(0.0, start + request.arrival_s - time.monotonic()))
        outcomes[i] = one(server, list(request.prompt), request.output_len)

    threads = [threading.Thread(target=send, args=(i, r), daemon=True) for i, r in enumerate(requests)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(600)
    return [o for o in outcomes if o is not None]


def one(server: tuple[str, str], prompt: list[int], max_tokens: int, first_token: threading.Event | None = None,
        stop: threading.Event | None = None) -> Outcome:  # fmt: skip
    """One streamed completion of `prompt` from `server` (its URL, the model name it serves); `first_token` is
    set when its first token arrives, and once `stop` is set the stream is closed (the server aborts it)."""
    url, model = server
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0, "ignore_eos": True,
            "stream": True, "stream_options": {"include_usage": True}}  # fmt: skip
    outcome = Outcome(len(prompt), start_time=time.monotonic())
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    times = []
    with urllib.request.urlopen(request, timeout=600) as response:
        for line in response:
            if not line.startswith(b"data: {"):
                continue
            chunk = json.loads(line[len(b"data: "):])
            if chunk.get("choices") and chunk["choices"][0].get("text"):
                times.append(time.monotonic())
                if first_token is not None:
                    first_token.set()
            if stop is not None and stop.is_set():
                break
            if chunk.get("phases"):
                outcome.phases = chunk["phases"][0]
    if times:
        outcome.success, outcome.ttft = True, times[0] - outcome.start_time
        outcome.latency, outcome.itl = times[-1] - outcome.start_time, [b - a for a, b in zip(times, times[1:])]
    return outcome
