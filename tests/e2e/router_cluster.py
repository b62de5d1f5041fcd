"""A live router on loopback with one prefill and one decode actor on local Ray: the served stack of e2e tests."""

from __future__ import annotations

import contextlib
import types

from decode_worker.actor import DecodeActor
from decode_worker.worker import DecodeWorkerConfig
from engine import EngineArgs
from router.control_client import control_endpoint
from prefill_worker.actor import PrefillActor
from runtime.ray_group import start_worker_actor
from prefill_worker.worker import PrefillWorkerConfig
from router.app import create_app
from router.config import RouterConfig
from router.server import RouterServer
from wire.socket_security import sender_keypair

# The tiny test models have no chat template of their own.
CHAT_TEMPLATE = (
    "{% for m in messages %}<s>{{ m['role'] }}\n{{ m['content'] }}</s>\n{% endfor %}"
    "{% if add_generation_prompt %}<s>assistant\n{% endif %}"
)


def _remote(ray, handle, key=None):
    """The actor's endpoint as the cluster registers it: over its control socket (with the cluster key)."""
    return control_endpoint(ray.get(handle.control_address.remote()), key=key)


@contextlib.contextmanager
def router_on_ray(ray, args: EngineArgs, config: RouterConfig, port: int = 0):
    """Yield (server, app, [prefill, decode]), the router on loopback at `port` (0: any free one).

    With `config.cluster_key` the workers get it too: every internal socket authenticates.
    On exit the workers must shut down clean (every block free); the actors are killed either way.
    """
    key = config.cluster_key.encoded() if config.cluster_key else ""  # as cluster/workers: in the worker's config
    router = sender_keypair().public if key else ""  # this process is the router: workers admit only its key
    keys = {"cluster_key": key, "router_key": router}
    prefill = start_worker_actor(PrefillActor, args, PrefillWorkerConfig("prefill-0", **keys))
    decode = start_worker_actor(DecodeActor, args, DecodeWorkerConfig("decode-0", **keys))
    app = create_app(config)
    ray.get([a.is_idle.remote() for a in (prefill, decode)])  # built: the cluster registers ready workers
    registry = app.state.router.registry
    for name, role, actor in (("prefill-0", "prefill", prefill), ("decode-0", "decode", decode)):
        registry.register(name, role, _remote(ray, actor, config.cluster_key), ray.get(actor.sender_key.remote()))
    server = RouterServer(app, port=port)
    try:
        yield types.SimpleNamespace(server=server, app=app, actors=[prefill, decode])
        assert ray.get([a.shutdown.remote() for a in (prefill, decode)]) == [True, True]
    finally:
        server.stop()
        for actor in (prefill, decode):
            ray.kill(actor, no_restart=True)
