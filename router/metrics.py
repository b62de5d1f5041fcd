"""Prometheus metrics, named as vLLM names them with a `tandem:` prefix where vLLM has one.

Per request (sequence): time to first token, time per output token, end-to-end
latency and its phases (`router.phases`: queue, prefill, KV transfer, decode seat, first decode step,
decode), finish reasons, prompt and generated tokens, prefix-cache queries and
hits (prompt tokens, and those the decode worker already held), attempts that
decode prefilled for want of a prefill worker (by reason). Per HTTP
response: status by endpoint. Per worker, read at scrape time from the
registry: waiting, running, in-flight as the router counts it, KV-cache usage,
prefix-cache hit rate, alive, suspect, and (decode workers) the KV transfers received:
count, bytes and seconds (first to last chunk of each), counters the worker
keeps since it started (a restarted worker starts again from zero, which
Prometheus reads as a counter reset); rate(bytes) / rate(count) is the mean
transfer size, rate(seconds) / rate(count) the mean transfer time.
Each app gets its own `CollectorRegistry`, so several routers can live in one process.
"""

from __future__ import annotations

import time
from functools import partial

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from wire.socket_security import refusals
from router.registry import WorkerRegistry

_LATENCY_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                    20.0, 40.0, 80.0)  # fmt: skip
# router.phases: one histogram each, vLLM's names (request_queue_time_seconds, ...) with ours for the handoff.
_PHASES = {
    "queue": "Arrival to the prompt's first step (routing, handoff, the worker's queue).",
    "prefill": "The prompt's first step to the step that sampled its first token.",
    "kv_transfer": "The first token at the decode worker to the prompt's KV there.",
    "decode_seat": "The KV and first token at the decode worker to a seat in its running batch.",
    "first_decode": "The seat to the step that made the second token.",
    "decode": "The second token to the last.",
}
_TPOT_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0)


class RouterMetrics:
    def __init__(self, workers: WorkerRegistry):
        r = self.registry = CollectorRegistry()
        latency = partial(Histogram, buckets=_LATENCY_BUCKETS, registry=r)
        counter = partial(Counter, registry=r)
        self.ttft = latency("tandem:time_to_first_token_seconds", "Time to first token.")
        self.tpot = Histogram("tandem:time_per_output_token_seconds", "Time per output token after the first.",
                              buckets=_TPOT_BUCKETS, registry=r)  # fmt: skip
        self.e2e = latency("tandem:e2e_request_latency_seconds", "End-to-end latency of one sequence.")
        self.finished = counter("tandem:request_success", "Sequences ended, by finish reason.", ["finished_reason"])
        self.http = counter("tandem:http_requests", "HTTP responses, by endpoint and status.", ["endpoint", "status"])
        self.prompt_tokens = counter("tandem:prompt_tokens", "Prompt tokens of finished sequences.")
        self.generation_tokens = counter("tandem:generation_tokens", "Generated tokens.")
        self.cache_queries = counter("tandem:prefix_cache_queries", "Prompt tokens looked up in the prefix cache.")
        self.cache_hits = counter("tandem:prefix_cache_hits", "Prompt tokens found in the prefix cache.")
        self.local_prefills = counter("tandem:local_prefill_fallbacks",
                                      "Sequences a decode worker prefilled itself because no prefill worker could "
                                      "take them, by reason (router.local_prefill).", ["reason"])  # fmt: skip
        self.in_flight = Gauge("tandem:num_sequences_in_flight", "Admitted sequences not yet ended.", registry=r)
        self.phases = {name: latency(f"tandem:request_{name}_time_seconds", what) for name, what in _PHASES.items()}
        self.phase_errors = counter("tandem:request_phase_accounting_errors",
                                    "Sequences whose workers' phases exceeded the router's interval (a bug).")
        r.register(_WorkerCollector(workers))

    def sequence_finished(self, arrived: float, first_token_at: float | None, final, phases=None,
                          now: float | None = None) -> None:  # fmt: skip
        now = time.monotonic() if now is None else now
        self.e2e.observe(now - arrived)
        if phases is not None:
            for name, histogram in self.phases.items():
                histogram.observe(getattr(phases, f"{name}_s"))
            if not phases.adds_up:
                self.phase_errors.inc()
        if first_token_at is not None:
            self.ttft.observe(first_token_at - arrived)
            if final.num_output_tokens > 1:
                self.tpot.observe((now - first_token_at) / (final.num_output_tokens - 1))
        self.finished.labels(final.finish_reason or "unknown").inc()
        self.prompt_tokens.inc(final.num_prompt_tokens)
        self.generation_tokens.inc(final.num_output_tokens)
        self.cache_queries.inc(final.num_prompt_tokens)
        self.cache_hits.inc(final.num_cached_tokens)

    def latency_totals(self) -> dict[str, tuple[float, float]]:
        """Cumulative (sum of seconds, count) of TTFT and TPOT: an autoscaler diffs two readings for a mean."""
        read = self.registry.get_sample_value
        return {name: (read(f"{metric}_sum") or 0.0, read(f"{metric}_count") or 0.0)
                for name, metric in (("ttft", "tandem:time_to_first_token_seconds"),
                                     ("tpot", "tandem:time_per_output_token_seconds"))}  # fmt: skip


class _WorkerCollector:
    """Per-worker gauges from the registry's last `load()` reports and the router's own counts, and what
    internal sockets refused."""

    def __init__(self, workers: WorkerRegistry):
        self._workers = workers

    def collect(self):
        families = {
            "waiting": GaugeMetricFamily("tandem:num_requests_waiting", "Requests queued on a worker.", labels=["worker", "role"]),
            "running": GaugeMetricFamily("tandem:num_requests_running", "Requests running on a worker.", labels=["worker", "role"]),
            "in_flight": GaugeMetricFamily("tandem:worker_in_flight", "Requests the router dispatched to a worker and not yet ended.", labels=["worker", "role"]),
            "kv": GaugeMetricFamily("tandem:kv_cache_usage_perc", "Fraction of a worker's KV blocks in use (0-1).", labels=["worker", "role"]),
            "hits": GaugeMetricFamily("tandem:worker_prefix_cache_hit_rate", "A worker's own prefix-cache hit rate.", labels=["worker", "role"]),
            "alive": GaugeMetricFamily("tandem:worker_alive", "1 while the worker is in its pool.", labels=["worker", "role"]),
            "suspect": GaugeMetricFamily("tandem:worker_suspect", "1 while a call to the worker failed since its last answered heartbeat.", labels=["worker", "role"]),
        }  # fmt: skip
        transfers = {
            "kv_transfers": CounterMetricFamily("tandem:kv_transfers", "KV transfers a decode worker received whole.", labels=["worker", "role"]),
            "kv_transfer_bytes": CounterMetricFamily("tandem:kv_transfer_bytes", "Bytes of KV a decode worker received in whole transfers.", labels=["worker", "role"]),
            "kv_transfer_seconds": CounterMetricFamily("tandem:kv_transfer_seconds", "Sum of KV transfer times (first to last chunk) on a decode worker.", labels=["worker", "role"]),
        }  # fmt: skip
        for w in list(self._workers.workers.values()):
            labels = [w.name, w.role]
            families["in_flight"].add_metric(labels, w.in_flight)
            families["alive"].add_metric(labels, 1.0 if w.alive else 0.0)
            families["suspect"].add_metric(labels, 1.0 if w.suspect else 0.0)
            if w.load is not None:
                families["waiting"].add_metric(labels, w.load.waiting)
                families["running"].add_metric(labels, w.load.running)
                used = 1 - w.load.free_blocks / w.load.total_blocks if w.load.total_blocks else 0.0
                families["kv"].add_metric(labels, used)
                families["hits"].add_metric(labels, w.load.prefix_cache_hit_rate)
                if w.role == "decode":
                    for name, family in transfers.items():
                        family.add_metric(labels, getattr(w.load, name))
        yield from families.values()
        yield from transfers.values()
        yield self._refusals()

    def _refusals(self) -> CounterMetricFamily:
        """What internal sockets refused (`wire.socket_security.refusals`), by process, socket and reason: this
        router's own (worker "router") and each worker's, from its latest heartbeat."""
        family = CounterMetricFamily("tandem:internal_messages_refused",
                                     "Internal ZMQ messages or connections refused and dropped, by process, socket "
                                     "and reason.", labels=["worker", "socket", "reason"])  # fmt: skip
        for (kind, reason), count in sorted(refusals().items()):
            family.add_metric(["router", kind, reason], count)
        for w in list(self._workers.workers.values()):
            for kind, reason, count in w.load.refused if w.load is not None else ():
                family.add_metric([w.name, kind, reason], count)
        return family
