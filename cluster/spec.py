"""The cluster spec: what `tandem serve` runs, from a YAML file or from flags, validated with pydantic.

    model: /path/to/model            # omitted: the default model (SmolLM2-135M-Instruct)
    data_plane: node_ip              # KV / token sockets on each node's address (default: loopback)
    engine: {max_model_len: 2048, block_size: 16, ...}   # shared by both pools (KV blocks must agree)
    router: {host: 127.0.0.1, port: 8000, routing_policy: cache_aware}
    prefill: {replicas: 1, tensor_parallel_size: 1, dtype: auto, resources: {gpu_a: 1}}
    decode:  {replicas: 2, tensor_parallel_size: 2, node_labels: {tier: decode}}
    autoscale: {enabled: true, decode: {min_replicas: 1, max_replicas: 4, max_latency_s: 0.1}}

A pool's `resources` and `node_labels` are per rank: a worker of TP size n asks
n times, all on one node (a STRICT_PACK placement group). Every mistake, in a
file or in flags, is a `SpecError` naming the field (`decode.replicas: ...`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from wire.liveness import LivenessPolicy
from router.http_protocol import ConnectionLimits
from router.policy import POLICIES
from router.tool_parsers import PARSERS

DTYPES = ("auto", "float32", "bfloat16", "float16")
QUANTIZATIONS = ("auto", "gguf", "int8", "none")  # engine.config.QUANTIZATIONS (the spec does not import the engine)
QUANTIZATION_HELP = ("auto (default): a GGUF model's weights stay in the file's quantized blocks where the CPU kernels "
                     "take them, multiplied by the kernel timed fastest per batch size (with AVX512-VNNI: integer "
                     "dot products over activations quantized to int8 per block among them, as llama.cpp does); "
                     "gguf: the blocks, multiplied in the dtype only; int8: as auto, and every other linear "
                     "(a float checkpoint's) quantized to int8 blocks of 32 (Q8_0) at load; none: widened to the "
                     "dtype")
_LIVENESS = LivenessPolicy()  # the defaults the router and the controller share
_CONNECTIONS = ConnectionLimits()


class SpecError(ValueError):
    """A cluster spec that cannot run; the message names every field at fault."""


class _Strict(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class PoolSpec(_Strict):
    """One pool of identical workers."""

    replicas: int = Field(1, ge=0)
    tensor_parallel_size: int = Field(1, ge=1)
    dtype: Literal[DTYPES] = "auto"
    resources: dict[str, float] = {}  # Ray custom resources per rank, e.g. {"gpu_a": 1}
    node_labels: dict[str, str] = {}  # Ray node labels every rank's node must carry
    num_gpus: float = Field(0, ge=0)  # per rank
    torch_threads: int | None = Field(1, ge=1)  # per rank (None: torch's default)

    @field_validator("resources")
    @classmethod
    def _positive(cls, resources: dict[str, float]) -> dict[str, float]:
        for name, amount in resources.items():
            if name in ("CPU", "GPU", "memory"):
                raise ValueError(f"{name!r} is not a custom resource (use num_gpus for GPUs)")
            if amount <= 0:
                raise ValueError(f"resource {name!r} must be > 0, got {amount}")
        return resources


class EngineSpec(_Strict):
    """Engine knobs both pools share (vLLM's names)."""

    max_model_len: int | None = Field(None, ge=1)
    max_num_seqs: int = Field(256, ge=1)
    max_num_batched_tokens: int = Field(2048, ge=1)
    block_size: int = Field(16, ge=1)
    enable_prefix_caching: bool = True
    kv_cache_memory: int | None = Field(None, gt=0)  # bytes per worker
    num_kv_blocks: int | None = Field(None, ge=1)
    # "auto": a GGUF model's linears in the file's quantized blocks (engine.gguf_weights); "none": widened
    quantization: Literal[QUANTIZATIONS] = "auto"

    @model_validator(mode="after")
    def _one_cache_size(self) -> "EngineSpec":
        if self.kv_cache_memory is not None and self.num_kv_blocks is not None:
            raise ValueError("set kv_cache_memory or num_kv_blocks, not both")
        return self


class ConnectionsSpec(_Strict):
    """Each HTTP connection's deadlines and bounds (router.http_protocol.ConnectionLimits)."""

    header_timeout_s: float = Field(_CONNECTIONS.header_timeout_s, gt=0)
    body_timeout_s: float = Field(_CONNECTIONS.body_timeout_s, gt=0)
    write_timeout_s: float = Field(_CONNECTIONS.write_timeout_s, gt=0)
    max_connections: int = Field(_CONNECTIONS.max_connections, ge=1)
    max_stream_backlog_bytes: int = Field(_CONNECTIONS.max_stream_backlog_bytes, ge=1 << 16)

    def limits(self) -> ConnectionLimits:
        return ConnectionLimits(**self.model_dump())


class RouterSpec(_Strict):
    host: str = "127.0.0.1"
    port: int = Field(8000, ge=0, le=65535)  # 0: any free port
    routing_policy: str = "cache_aware"
    served_model_name: str = ""
    max_in_flight: int = Field(256, ge=1)
    max_predicted_ttft_s: float = Field(60.0, ge=0)  # 429 for a request predicted to wait longer (0: off)
    api_key: str = Field("", repr=False)  # "": the API is open; else /v1/* and /admin/* need it as a Bearer token
    max_request_body_bytes: int = Field(8 << 20, ge=1)
    max_buffered_body_bytes: int = Field(256 << 20, ge=1)  # all bodies buffered at once; past it 503 + Retry-After
    # SIGTERM or Ctrl-C: admission closes (503, /health fails) and what is in flight may finish for this long
    # before the workers stop (Kubernetes' default grace before SIGKILL is 30 s too)
    shutdown_grace_s: float = Field(30.0, ge=0)
    tool_call_parser: str = ""  # "": tool_choice auto is refused; else a name in router.tool_parsers.PARSERS
    # Host header names answered ([]: the loopback names when `host` is loopback, else any; router.http_guard)
    allowed_hosts: list[str] = []
    connections: ConnectionsSpec = ConnectionsSpec()  # slow and stalled clients: deadlines, bounds

    @field_validator("tool_call_parser")
    @classmethod
    def _known_parser(cls, name: str) -> str:
        if name and name not in PARSERS:
            raise ValueError(f"unknown tool call parser {name!r}: choose one of {', '.join(sorted(PARSERS))}")
        return name

    @field_validator("routing_policy")
    @classmethod
    def _known_policy(cls, name: str) -> str:
        if name not in POLICIES:
            raise ValueError(f"unknown routing policy {name!r}: choose one of {', '.join(sorted(POLICIES))}")
        return name


class HealthSpec(_Strict):
    """How the controller watches workers, and the liveness rules it and the router judge them by.

    Every `interval_s` the controller reads each rank's heartbeat (rank 0's `load()`, a
    tensor-parallel follower's Ray readiness), one call in flight per rank; a call unanswered
    for `timeout_s` is one miss (so is one router load poll, `RouterConfig.worker_call_timeout_s`).
    `wire.liveness` decides death from misses and from what the answers say: busy is not dead.
    """

    interval_s: float = Field(1.0, gt=0)
    timeout_s: float = Field(10.0, gt=0)
    # Dead only after `misses_before_dead` misses in a row and no answer for `silent_after_s`
    # (Ray reporting an actor dead counts at once); an answering worker is dead when its step has
    # run `stuck_factor` times its longest (and at least `stuck_floor_s`: a long prefill on a
    # CPU takes minutes), or `max_failed_steps` steps failed in a row (a sticky device error).
    misses_before_dead: int = Field(_LIVENESS.misses_before_dead, ge=1)
    silent_after_s: float = Field(_LIVENESS.silent_after_s, gt=0)
    stuck_factor: float = Field(_LIVENESS.stuck_factor, gt=0)
    stuck_floor_s: float = Field(_LIVENESS.stuck_floor_s, gt=0)
    max_failed_steps: int = Field(_LIVENESS.max_failed_steps, ge=1)
    start_timeout_s: float = Field(600.0, gt=0)  # building a worker (model load, kernels) may take minutes
    drain_timeout_s: float = Field(120.0, gt=0)
    # A worker that dies again within `stable_after_s` of its start waits before the next
    # restart: `restart_backoff_s`, doubling per death in a row, at most `restart_backoff_max_s`.
    restart_backoff_s: float = Field(1.0, ge=0)
    restart_backoff_max_s: float = Field(60.0, ge=0)
    stable_after_s: float = Field(60.0, ge=0)
    # Ray restarts a controller actor that died this many times (-1: always); the workers outlive it.
    controller_max_restarts: int = Field(10, ge=-1)

    def liveness(self) -> LivenessPolicy:
        """The policy both the controller's heartbeats and the router's load polls are judged by."""
        return LivenessPolicy(self.misses_before_dead, self.silent_after_s, self.stuck_factor, self.stuck_floor_s,
                              self.max_failed_steps)  # fmt: skip


class PoolAutoscale(_Strict):
    """Bounds of one pool under the autoscaler, and the targets that grow it (see `cluster.autoscaler`)."""

    min_replicas: int = Field(1, ge=0)
    max_replicas: int = Field(4, ge=1)
    max_waiting_per_worker: float = Field(4.0, gt=0)  # prefill: prompts queued per worker
    max_kv_usage: float = Field(0.85, gt=0, le=1)  # decode: mean fraction of KV blocks in use
    max_latency_s: float | None = Field(None, gt=0)  # prefill: mean TTFT; decode: mean TPOT (None: not used)

    @model_validator(mode="after")
    def _ordered(self) -> "PoolAutoscale":
        if self.min_replicas > self.max_replicas:
            raise ValueError(f"min_replicas {self.min_replicas} is above max_replicas {self.max_replicas}")
        return self


class AutoscaleSpec(_Strict):
    """Off unless `enabled`: then every `interval_s` each pool may grow or shrink by one, at most once per `cooldown_s`."""

    enabled: bool = False
    interval_s: float = Field(5.0, gt=0)
    cooldown_s: float = Field(60.0, ge=0)
    prefill: PoolAutoscale = PoolAutoscale()
    decode: PoolAutoscale = PoolAutoscale()

    def pool(self, role: str) -> PoolAutoscale:
        return self.prefill if role == "prefill" else self.decode


class GrammarSpec(_Strict):
    """Structured-output grammars (guided_json, guided_regex, response_format ...), compiled on each worker
    (runtime.grammar_compiles)."""

    compile_timeout_s: float = Field(30.0, gt=0)  # longer: the request is refused (400) as an invalid grammar
    max_compiles_waiting: int = Field(16, ge=1)  # more at once: a request with a new grammar gets 503


class ClusterSpec(_Strict):
    model: str | None = None
    # Where the KV, inbox and token-stream sockets bind: loopback (one machine) or each node's
    # Ray address (workers on several machines; `tandem serve --address` picks it unless set).
    data_plane: Literal["loopback", "node_ip"] = "loopback"
    # A KV transfer that fails: decode prefills the prompt itself (recompute) or the request ends with an error.
    kv_transfer_failure: Literal["recompute", "fail"] = "recompute"
    # One machine without GPUs: each worker rank on cores of its own (cluster.core_map), so one phase's
    # steps cannot slow the other's through the CPU; off: every rank shares every core.
    cpu_pinning: bool = True
    engine: EngineSpec = EngineSpec()
    router: RouterSpec = RouterSpec()
    prefill: PoolSpec = PoolSpec()
    decode: PoolSpec = PoolSpec()
    health: HealthSpec = HealthSpec()
    autoscale: AutoscaleSpec = AutoscaleSpec()
    grammars: GrammarSpec = GrammarSpec()
    # The CURVE key every internal socket authenticates with ("<public>:<secret>", Z85); "": the
    # deployment generates one per cluster (wire.socket_security).
    cluster_key: str = Field("", repr=False)
    # The router's sender key, public half (Z85): the one key workers' control sockets and the controller's
    # membership socket admit. Set by the deployment to its serving process's own (a spec's value is replaced).
    router_key: str = ""

    @field_validator("cluster_key")
    @classmethod
    def _key_format(cls, text: str) -> str:
        from wire.socket_security import ClusterKey

        return ClusterKey.parse(text).encoded() if text else text

    @model_validator(mode="after")
    def _servable(self) -> "ClusterSpec":
        if self.decode.replicas < 1:
            raise ValueError("decode.replicas must be >= 1: decode workers serve every request")
        return self

    def pool(self, role: str) -> PoolSpec:
        return self.prefill if role == "prefill" else self.decode


def parse_spec(data: dict | None) -> ClusterSpec:
    """Validate a dict (a parsed YAML document); raises SpecError naming each field at fault."""
    if data is not None and not isinstance(data, dict):
        raise SpecError(f"a cluster spec is a mapping of fields, got {type(data).__name__}")
    try:
        return ClusterSpec.model_validate(data or {})
    except ValidationError as err:
        raise SpecError(_describe(err)) from None


def load_spec(path: str | Path) -> ClusterSpec:
    import yaml

    try:
        data = yaml.safe_load(Path(path).read_text())
    except OSError as err:
        raise SpecError(f"cannot read cluster spec {path}: {err.strerror}") from None
    except yaml.YAMLError as err:
        raise SpecError(f"{path} is not valid YAML: {err}") from None
    try:
        return parse_spec(data)
    except SpecError as err:
        raise SpecError(f"{path}: {err}") from None


def with_overrides(spec: ClusterSpec, overrides: dict) -> ClusterSpec:
    """`spec` with dotted fields replaced ({"decode.replicas": 2}), validated again (fields set stay set)."""
    data = spec.model_dump(exclude_unset=True)
    for dotted, value in overrides.items():
        node = data
        *parents, leaf = dotted.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return parse_spec(data)


def _describe(err: ValidationError) -> str:
    lines = []
    for e in err.errors():
        where = ".".join(str(p) for p in e["loc"]) or "spec"
        message = e["msg"].removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            message = "unknown field"
        lines.append(f"{where}: {message}")
    return "; ".join(lines)
