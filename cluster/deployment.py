"""Everything `tandem serve` runs, minus the command line: Ray, the router, the controller.

    deployment = Deployment(spec)     # connects to Ray; the router listens at once (/health: 503)
    deployment.start()                # pools launched and registered, /health ready
    ...                               # deployment.url, deployment.controller.scale(...)
    deployment.stop()                 # workers drained of nothing, stopped; router stopped

The router (and the admin endpoints) run on a thread of this process; the
workers are Ray actors placed by the controller. Ownership: the deployment
owns the router server and the controller; Ray itself belongs to the caller
(`connect_ray` / `ray.shutdown`).
"""

from __future__ import annotations

import time
import urllib.request

from cluster.admin import install_admin_routes
from cluster.controller import Controller, RouterLink
from cluster.spec import ClusterSpec


def connect_ray(address: str | None) -> str:
    """Join the Ray cluster at `address`, or start an embedded local one (loopback only); returns what it is."""
    import ray

    common = dict(logging_level="WARNING", configure_logging=False)
    if address:
        ray.init(address=address, **common)
        return f"Ray cluster at {address}"
    # "local": always a new Ray of our own, never one a `ray start` left running on this machine.
    ray.init(address="local", _node_ip_address="127.0.0.1", include_dashboard=False, **common)
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
        worker_call_timeout_s=spec.health.timeout_s,  # the router's load() polls are heartbeats too
        stream_address=f"tcp://{_data_host(spec)}:0",
    )


def _data_host(spec: ClusterSpec) -> str:
    import ray

    return ray.util.get_node_ip_address() if spec.data_plane == "node_ip" else "127.0.0.1"


class Deployment:
    def __init__(self, spec: ClusterSpec):
        from router.app import create_app
        from router.policy import make_decode_policy, make_policy
        from router.registry import WorkerRegistry
        from router.server import RouterServer

        self.spec = spec
        self.config = router_config(spec)
        policy = make_policy(self.config.routing_policy, **dict(self.config.routing_options))
        registry = WorkerRegistry(policy, make_decode_policy(block_size=spec.engine.block_size))
        self.app = create_app(self.config, registry)
        install_admin_routes(self.app)
        self.server = RouterServer(self.app, spec.router.host, spec.router.port)
        self.controller = self.app.state.controller = Controller(spec, RouterLink(self.server))

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

    def stop(self) -> None:
        try:
            self.controller.shutdown()
        finally:
            self.server.stop()


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=5) as response:
            return response.status == 200
    except OSError:  # URLError, HTTPError (503), connection refused
        return False
