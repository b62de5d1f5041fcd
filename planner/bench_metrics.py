"""The serving metrics of a finished run, named as `vllm bench serve` names them in its result JSON: one
reckoning for our serving benchmark's measured runs (`scripts/serving_bench`) and the simulator's
predicted ones (`planner.sim`), so the two compare field by field.

TTFT: send to first text chunk. TPOT: (E2EL - TTFT) / (output tokens - 1), per request.
ITL: gaps between text chunks, pooled over requests. E2EL: send to last byte. All in ms in the
result. Goodput: requests/s of the completed ones that meet every SLO given (ttft, tpot, e2el, ms).
"""

from __future__ import annotations

from typing import Protocol, Sequence

import numpy as np

METRICS = ("ttft", "tpot", "itl", "e2el")


class RequestOutput(Protocol):
    """What the reckoning reads of one request: when it was sent, whether it succeeded, its timings (s)."""

    prompt_len: int
    start_time: float
    success: bool
    ttft: float
    latency: float
    itl: Sequence[float]


def parse_goodput(items: list[str] | None) -> dict[str, float]:
    """["ttft:200", "tpot:50"] -> {"ttft": 200.0, "tpot": 50.0} (ms); unknown names and bad values raise."""
    slos = {}
    for item in items or ():
        name, sep, value = item.partition(":")
        if not sep or name not in ("ttft", "tpot", "e2el"):
            raise ValueError(f"--goodput takes ttft:MS, tpot:MS or e2el:MS, got {item!r}")
        slos[name] = float(value)
        if slos[name] < 0:
            raise ValueError(f"an SLO is not negative, got {item!r}")
    return slos


def percentile_key(metric: str, p: float) -> str:
    """p99_ttft_ms, p99.9_itl_ms: whole percentiles print without a decimal point."""
    return f"p{int(p) if float(p).is_integer() else p}_{metric}_ms"


def tpot(out: RequestOutput, output_len: int) -> float:
    """Seconds per output token after the first; 0 for a one-token output."""
    return (out.latency - out.ttft) / (output_len - 1) if output_len > 1 else 0.0


def metric_values(outputs: list[RequestOutput], output_lens: list[int]) -> dict[str, list[float]]:
    """Seconds per metric over the successful requests (ITL pooled; TPOT only where more than one token)."""
    done = [(o, n) for o, n in zip(outputs, output_lens) if o.success]
    return {"ttft": [o.ttft for o, _ in done], "tpot": [tpot(o, n) for o, n in done if n > 1],
            "itl": [gap for o, _ in done for gap in o.itl], "e2el": [o.latency for o, _ in done]}  # fmt: skip


def summarize(values_s: list[float], metric: str, percentiles: list[float]) -> dict[str, float]:
    """mean / median / std / chosen percentiles in ms; zeros when nothing was measured."""
    ms = np.asarray(values_s or [0.0]) * 1000
    stats = {f"mean_{metric}_ms": float(ms.mean()), f"median_{metric}_ms": float(np.median(ms)),
             f"std_{metric}_ms": float(ms.std())}  # fmt: skip
    stats.update({percentile_key(metric, p): float(np.percentile(ms, p)) for p in percentiles})
    return stats


def token_times(out: RequestOutput) -> list[float]:
    """perf_counter time of each text chunk of a successful request."""
    if not out.success:
        return []
    return (out.start_time + out.ttft + np.cumsum([0.0, *out.itl])).tolist()


def in_flight_peaks(outputs: list[RequestOutput], t0: float, seconds: int) -> np.ndarray:
    """The most requests in flight at once (sent, not yet answered in full) within each whole second from t0."""
    # +1 at each send, -1 at each end; at the same instant ends sort first (-1 < 1).
    events = sorted([(o.start_time, 1) for o in outputs] + [(o.start_time + o.latency, -1) for o in outputs])
    peaks, now, i = np.zeros(seconds, dtype=int), 0, 0
    for second in range(seconds):
        peak = now  # the requests still running from before this second
        while i < len(events) and (events[i][0] < t0 + second + 1 or second == seconds - 1):
            now += events[i][1]
            peak, i = max(peak, now), i + 1
        peaks[second] = peak
    return peaks


def per_second(outputs: list[RequestOutput], output_lens: list[int], t0: float, duration: float):
    """(output tokens in each whole second from t0, peak requests in flight in each). A chunk's tokens are
    spread evenly over the request's chunks (the server may pack several tokens into one)."""
    seconds = max(1, int(np.ceil(duration)))
    tokens = np.zeros(seconds)
    for out, n in zip(outputs, output_lens):
        times = token_times(out)
        for t in times:
            tokens[min(seconds - 1, int(t - t0))] += n / len(times)
    return tokens, in_flight_peaks(outputs, t0, seconds)


def compute_metrics(outputs: list[RequestOutput], output_lens: list[int], duration: float, t0: float,
                    slos: dict[str, float], metrics: list[str], percentiles: list[float]) -> dict:  # fmt: skip
    """The benchmark result: counts, throughputs, goodput (None without SLOs), then each metric's stats.

    `output_lens[i]` is the output token count of outputs[i] (0 for a failed one).
    """
    done = [(o, n) for o, n in zip(outputs, output_lens) if o.success]
    values = metric_values(outputs, output_lens)
    total_input, total_output = sum(o.prompt_len for o, _ in done), sum(n for _, n in done)
    good = sum(
        all(value * 1000 <= slos[name] for name, value in (("ttft", o.ttft), ("tpot", tpot(o, n)), ("e2el", o.latency))
            if name in slos)  # fmt: skip
        for o, n in done
    )
    tokens_per_s, running = per_second(outputs, output_lens, t0, duration)
    result = {
        "duration": duration,
        "completed": len(done),
        "failed": len(outputs) - len(done),
        "total_input_tokens": total_input,
        "total_output_tokens": total_output,
        "request_throughput": len(done) / duration,
        "request_goodput": good / duration if slos else None,
        "output_throughput": total_output / duration,
        "total_token_throughput": (total_input + total_output) / duration,
        "max_output_tokens_per_s": float(tokens_per_s.max()),
        "max_concurrent_requests": int(running.max()),
    }
    for metric in metrics:
        result.update(summarize(values[metric], metric, percentiles))
    return result
