"""The router's settings, fixed for its lifetime (the `tandem serve` CLI builds one from flags)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from router.handoff import HandoffTimeouts
from router.http_protocol import ConnectionLimits
from wire.liveness import LivenessPolicy
from wire.socket_security import ClusterKey
from router.limits import RequestLimits
from router.local_prefill import LocalPrefillRule


@dataclass(frozen=True)
class RouterConfig:
    model_dir: str  # where the tokenizer (and config.json, for the context length) are read from
    served_model_name: str = ""  # the `model` clients name; "" -> the model directory's base name
    max_model_len: int | None = None  # prompt + output tokens; None -> config.json's max_position_embeddings
    host: str = "127.0.0.1"
    port: int = 8000
    routing_policy: str = "cache_aware"  # a name in router.policy.POLICIES (cache_aware, least_loaded, round_robin)
    routing_options: tuple[tuple[str, object], ...] = ()  # keyword options for the policy
    colocated: bool = False  # True: decode workers prefill themselves; no prefill pool is needed
    max_in_flight: int = 256  # admitted sequences (a request with n=4 counts 4); beyond: 429
    retry_after_s: int = 1  # the Retry-After a 429 carries
    # A new request whose first token is predicted later than this is refused at once with 429 and a
    # Retry-After (router.ttft_prediction) rather than queued; shorter than the watchdog below (0: off).
    max_predicted_ttft_s: float = 60.0
    load_refresh_s: float = 0.5  # how often every worker's `load()` is read
    worker_call_timeout_s: float = 10.0  # a load() slower than this is a missed heartbeat (see `liveness`)
    liveness: LivenessPolicy = field(default_factory=LivenessPolicy)  # when a worker that stops answering is dead
    # When decode prefills a prompt itself because the prefill pool is far behind (see router.local_prefill).
    local_prefill: LocalPrefillRule = field(default_factory=LocalPrefillRule)
    stream_address: str = "tcp://127.0.0.1:0"  # the token stream's PULL (workers PUSH to it)
    chat_template: str | None = None  # a Jinja template; None -> the tokenizer's own
    tool_call_parser: str | None = None  # how tool_choice "auto" reads calls in the output (router.tool_parsers)
    handoff: HandoffTimeouts = field(default_factory=HandoffTimeouts)
    # Watchdog: a request with no token for this long is resumed on other workers (ended once its resumes are
    # spent); longer than a KV transfer's deadline (120 s), which ends a stuck transfer first (0: off).
    no_token_timeout_s: float = 180.0
    max_resumes: int = 3  # a request whose worker died is resumed elsewhere at most this many times
    api_key: str | None = field(default=None, repr=False)  # set: /v1/* needs `Authorization: Bearer <key>`
    admin_token: str | None = field(default=None, repr=False)  # /admin/* needs it (None: closed); cluster.admin_token
    allowed_hosts: tuple[str, ...] = ()  # Host names answered; (): loopback names when bound to loopback, else any
    max_request_body_bytes: int = 8 << 20  # a larger HTTP body is refused (413)
    # The bytes of all HTTP bodies being buffered at once (32 bodies at the limit); past it a body is refused
    # at once (503 + Retry-After), so slow uploads on many connections cannot hold the router's memory.
    max_buffered_body_bytes: int = 256 << 20
    limits: RequestLimits = field(default_factory=RequestLimits)  # work one request may ask for (400 beyond)
    # Deadlines and bounds of each HTTP connection and stream: slow or stalled clients (router.http_protocol).
    connections: ConnectionLimits = field(default_factory=ConnectionLimits)
    # Workers authenticate to the token stream with it (None: this process's TANDEM_CLUSTER_KEY, if any).
    cluster_key: ClusterKey | None = field(default=None, repr=False)

    @property
    def model_name(self) -> str:
        return self.served_model_name or os.path.basename(os.path.normpath(self.model_dir))
