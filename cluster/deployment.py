"""Everything `tandem serve` runs, minus the command line: Ray, the router, the controller.

    deployment = Deployment(spec)     # the controller actor; the router listens at once (/health: 503)
    deployment.start()                # pools launched and registered, /health ready
    ...                               # deployment.url, deployment.controller.scale(...)
    deployment.stop()                 # workers drained of nothing, stopped; controller, router stopped

The router (and the admin endpoints) run on a thread of this process and keep
their registry in step with the controller actor over its membership socket
(`cluster.router_sync`); the
controller places the workers as Ray actors, detached and named in the
deployment's own namespace so that they outlive a controller that dies (Ray
restarts it and it takes them over). Ownership: the deployment owns the router
server, the controller actor and, through it, every worker: `stop` kills them
all, by name when the controller cannot (`cluster.reaper`). Ray itself belongs
to the caller (`connect_ray` / `ray.shutdown`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
import urllib.request

from cluster.actor_names import new_namespace
from cluster.admin import install_admin_routes, scale_bounds
from cluster.admin_token import forget_token, new_token, write_token
from cluster.controller_actor import ControllerClient, start_controller
from cluster.reaper import reap
from cluster.router_sync import RouterSync
from cluster.spec import ClusterSpec, with_overrides
from wire.socket_security import ClusterKey, sender_keypair

logger = logging.getLogger("tandem.cluster")


def connect_ray(address: str | None) -> str:
    """Join the Ray cluster at `address`, or start an embedded local one (loopback only); returns what it is."""
    import ray

    common = dict(logging_level="WARNING", configure_logging=False)
    if address:
        ray.init(address=address, **common)
        return f"Ray cluster at {address}"
    # "local": always a new Ray of our own, never one a `ray start` left running on this machine. Ray starts
    # its workers at niceness 15 by default: the workers that run the model would then yield the cores to
    # every other process (the router's own streaming, Ray's agents, a benchmark client): measured on 2 cores,
    # the same 2,048-token prefill step took 0.78 to 1.47 s at 15.
    ray.init(address="local", _node_ip_address="127.0.0.1", include_dashboard=False,
             _system_config={"worker_niceness": 0}, **common)  # fmt: skip
    return "embedded local Ray"


def router_config(spec: ClusterSpec):
    """The router's config (with `data_plane: node_ip` its token stream binds on this node's Ray address)."""
    from engine.model_source import model_display_name, resolve_model
    from router.config import RouterConfig

    r = spec.router
    return RouterConfig(
        model_dir=str(resolve_model(spec.model)),  # converts the default GGUF once, before any worker does
        served_model_name=r.served_model_name or model_display_name(spec.model),
        max_model_len=spec.engine.max_model_len,
        host=r.host,
        port=r.port,
        routing_policy=r.routing_policy,
        routing_options=(("block_size", spec.engine.block_size),) if r.routing_policy == "cache_aware" else (),
        colocated=spec.prefill.replicas == 0,
        max_in_flight=r.max_in_flight,
        max_predicted_ttft_s=r.max_predicted_ttft_s,
        api_key=r.api_key or None,
        max_request_body_bytes=r.max_request_body_bytes,
        max_buffered_body_bytes=r.max_buffered_body_bytes,
        tool_call_parser=r.tool_call_parser or None,
        allowed_hosts=tuple(r.allowed_hosts),
        connections=r.connections.limits(),
        # The router's load() polls are heartbeats too, judged by the controller's rules: one poll
        # unanswered for timeout_s is one miss, and the liveness policy says when misses mean dead.
        worker_call_timeout_s=spec.health.timeout_s,
        liveness=spec.health.liveness(),
        stream_address=f"tcp://{_data_host(spec)}:0",
        cluster_key=ClusterKey.parse(spec.cluster_key) if spec.cluster_key else None,
    )


def with_cluster_key(spec: ClusterSpec) -> ClusterSpec:
    """`spec` with a cluster key (its own, or a new one: each deployment its own, unless the spec fixes it) and
    the router's key: this process's sender key, whose secret never leaves it (the router runs here)."""
    key = spec.cluster_key or ClusterKey.generate().encoded()
    return with_overrides(spec, {"cluster_key": key, "router_key": sender_keypair().public})


def _data_host(spec: ClusterSpec) -> str:
    import ray

    return ray.util.get_node_ip_address() if spec.data_plane == "node_ip" else "127.0.0.1"


class Deployment:
    def __init__(self, spec: ClusterSpec):
        from router.app import create_app
        from router.policy import make_pool_policies
        from router.registry import WorkerRegistry
        from router.server import RouterServer

        self.spec = spec = with_cluster_key(spec)
        self.admin_token = new_token()  # written for `tandem scale/status` once the port is known
        self.config = dataclasses.replace(router_config(spec), admin_token=self.admin_token)
        policies = make_pool_policies(self.config.routing_policy, dict(self.config.routing_options),
                                      spec.engine.block_size, self.config.colocated)  # fmt: skip
        registry = WorkerRegistry(*policies)
        self.app = create_app(self.config, registry)
        install_admin_routes(self.app, scale_bounds(spec))
        self.server = RouterServer(self.app, spec.router.host, spec.router.port)
        self._token_file = write_token(spec.router.host, self.server.port, self.admin_token)
        self.namespace = new_namespace()  # where its workers are named (cluster.actor_names)
        self.controller = self.app.state.controller = ControllerClient(start_controller(spec, self.namespace))
        sync = RouterSync(registry, self._membership_address, self.app.state.router.metrics.latency_totals,
                          self.config.cluster_key)  # fmt: skip
        self._sync_task = self.server.call(lambda: asyncio.get_running_loop().create_task(sync.run()))
        self._stopped = False

    async def _membership_address(self) -> str:
        """Where the controller actor's membership socket is (Ray waits while it restarts)."""
        return await self.controller.handle.membership_address.remote()

    @property
    def url(self) -> str:
        return self.server.url

    def start(self) -> None:
        """Launch the pools; return once /health answers 200 (raises what launching raised)."""
        self.controller.start()
        deadline = time.monotonic() + self.spec.health.start_timeout_s
        while not _healthy(self.url):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.url}/health did not become ready")
            time.sleep(0.1)

    def drain(self, grace_s: float) -> int:
        """Close the router's admission (new requests: 503, /health fails) and wait up to `grace_s` for the
        sequences in flight to end; how many are left (0: all ended). The workers keep serving: `stop` after."""
        admission = self.app.state.router.runner.admission
        self.server.call(lambda: admission.close("the server is shutting down"))
        deadline = time.monotonic() + grace_s
        while self.in_flight() and time.monotonic() < deadline:
            time.sleep(0.1)
        return self.in_flight()

    def in_flight(self) -> int:
        """Sequences the router has admitted and not yet ended."""
        return self.server.call(lambda: self.app.state.router.runner.admission.in_use)

    def stop(self, ray_alive: bool = True) -> None:
        """Every worker and the controller stopped, then the router. `ray_alive=False`: the Ray cluster is
        gone (and every worker with it), only the router is left to stop. Once: later calls do nothing."""
        if self._stopped:
            return
        self._stopped = True
        try:
            if ray_alive:
                self._stop_workers()  # the router keeps syncing meanwhile: it sees each worker leave
        finally:
            self.server.call(self._sync_task.cancel)
            self.server.stop()
            forget_token(self.spec.router.host, self.server.port, self.admin_token)

    def _stop_workers(self) -> None:
        try:
            self.controller.shutdown()
        except Exception as err:  # dead for good: its workers are detached, nobody else would stop them
            logger.warning("the controller could not stop the workers (%s: %s)", type(err).__name__, err)
        finally:
            reap(self.namespace)


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=5) as response:
            return response.status == 200
    except OSError:  # URLError, HTTPError (503), connection refused
        return False
