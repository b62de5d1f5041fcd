"""One worker of a pool on Ray: start it where its pool says, reach it, stop it.

A worker is one Ray actor (TP=1) or a tensor-parallel group of actors in one
STRICT_PACK placement group (TP=n), whose rank 0 is its face. With
`data_plane: node_ip` workers bind every socket (control, KV, inbox, rank
links) on their node's Ray address, so routers and peers on other machines
reach them. `launch` returns
at once for TP=1 (the actor builds its engine in the background; `wait_ready`
waits for it); a TP group is ready when `launch` returns. The router calls a
worker over its rank 0's control socket (`endpoint`, router.control_client),
bound on loopback or, with `data_plane: node_ip`, on the node's address; Ray
stays for the lifecycle (start, health, stop).

Each worker gets the cluster's key (spec.cluster_key) in its config, an argument of
its actors (never Ray's runtime_env), for its internal sockets; it makes its own
sender key, whose public half `wait_ready` learns for the router (wire.socket_security).

Launched with a namespace (the deployment's), every rank and the placement
group are named and detached (`cluster.actor_names`): they outlive the
controller actor, which finds them again after its restart (`cluster.adoption`).

Ownership: whoever launched a `PoolWorker` kills it (`stop` or `kill`); the
controller does, for every worker it started or adopted (a detached actor is
never killed by Ray on anyone's behalf: `cluster.reaper` sweeps up after a
deployment whose controller could not).
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass

from cluster.actor_names import detached, follower_name, group_name, rank0_name
from cluster.heartbeat import Answer
from cluster.spec import ClusterSpec, PoolSpec
from decode_worker.actor import DecodeActor
from decode_worker.worker import DecodeWorkerConfig
from engine.llm_engine import EngineArgs
from router.control_client import ControlEndpoint, control_endpoint
from prefill_worker.actor import PrefillActor
from prefill_worker.worker import PrefillWorkerConfig
from runtime.ray_group import TPNames, start_tp_actors, start_worker_actor
from runtime.worker_config import NODE_IP

# One actor class per role, for every TP rank; where it binds is its config's `host`.
ACTOR_CLASSES = {"prefill": PrefillActor, "decode": DecodeActor}
COLOCATED_THRESHOLD = 1 << 62  # more uncached tokens than any prompt has: prefill everything locally


def engine_args_for(spec: ClusterSpec, role: str) -> EngineArgs:
    pool = spec.pool(role)  # EngineSpec's fields are EngineArgs' names
    return EngineArgs(model=spec.model, dtype=pool.dtype, tensor_parallel_size=pool.tensor_parallel_size,
                      **spec.engine.model_dump())  # fmt: skip


def placement_options(pool: PoolSpec) -> dict:
    """Ray `.options()` placing one rank where its pool says (resources, GPUs, node labels)."""
    options: dict = {"num_gpus": pool.num_gpus}
    if pool.resources:
        options["resources"] = dict(pool.resources)
    if pool.node_labels:
        options["label_selector"] = dict(pool.node_labels)
    return options


@dataclass
class PoolWorker:
    name: str
    role: str  # "prefill" | "decode"
    rank0: object  # the Ray actor handle the router calls
    tp: object | None = None  # runtime.ray_group.TPActors when tensor-parallel
    node_id: str = ""
    restarts: int = 0
    quick_deaths: int = 0  # deaths in a row soon after starting (`cluster.restart_backoff`)
    started_at: float = dataclasses.field(default_factory=time.monotonic)
    control_address: str = ""  # rank 0's control socket, learnt by `wait_ready`
    actor_id: str = ""  # rank 0's Ray actor id, learnt by `wait_ready`: its incarnation, the same to every controller
    sender_key: str = ""  # the public key rank 0's token deltas carry, learnt by `wait_ready` ("" unauthenticated)

    def endpoint(self, key=None) -> ControlEndpoint:
        """How the router calls this worker: over rank 0's control socket (call after `wait_ready`),
        presenting the cluster key `key` (a `ClusterKey`; None: the calling process's, if any)."""
        if not self.control_address:
            raise RuntimeError(f"{self.name}: no control address yet (wait_ready first)")
        return control_endpoint(self.control_address, key=key)

    def wait_ready(self, timeout_s: float, stop=None) -> None:
        """Block until the engine is built (raises what building it raised); learn where it is.

        `stop` (a threading.Event) set meanwhile ends the wait early with InterruptedError."""
        import ray

        ready, deadline = self.rank0.is_idle.remote(), time.monotonic() + timeout_s
        while not ray.wait([ready], timeout=0.5)[0]:
            if stop is not None and stop.is_set():
                raise InterruptedError(f"{self.name}: stopped while starting")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.name} was not built within {timeout_s:.0f} s (no node with room for it?)")
        ray.get(ready)
        self.learn_whereabouts(timeout_s)

    def learn_whereabouts(self, timeout_s: float) -> None:
        """Its node, rank 0's actor id, control address and sender key (rank 0 must be serving)."""
        import ray

        self.node_id, self.actor_id, self.sender_key = ray.get(self.rank0.__ray_call__.remote(_whereabouts),
                                                               timeout=timeout_s)  # fmt: skip
        self.control_address = ray.get(self.rank0.control_address.remote(), timeout=timeout_s)

    def probes(self) -> list[RayProbe]:
        """A readiness probe per rank (`cluster.heartbeat`): rank 0's health beyond that is the router's to judge."""
        followers = self.tp.followers if self.tp is not None else []
        return [RayProbe(rank, actor) for rank, actor in enumerate([self.rank0, *followers])]

    def is_idle(self, timeout_s: float) -> bool:
        """Nothing queued or running on it; raises if it does not answer within `timeout_s`."""
        import ray

        return ray.get(self.rank0.is_idle.remote(), timeout=timeout_s)

    def stop(self, timeout_s: float = 60.0) -> bool:
        """Shut down cleanly (True if its block pool was all free), then kill; a dead worker is just killed."""
        import ray

        try:
            if self.tp is not None:
                return all(self.tp.shutdown(timeout_s))
            return bool(ray.get(self.rank0.shutdown.remote(), timeout=timeout_s))
        except Exception:
            return False
        finally:
            self.kill()

    def kill(self) -> None:
        """Idempotent: a worker already dead (or killed) is fine."""
        import ray

        try:
            if self.tp is not None:
                self.tp.kill()
            else:
                ray.kill(self.rank0, no_restart=True)
        except Exception:
            pass  # already gone


class RayProbe:
    """One rank's readiness over Ray (`cluster.heartbeat.Probe`): its process answers, or Ray says it is gone."""

    def __init__(self, rank: int, actor):
        self.rank, self.actor = rank, actor

    def send(self):
        return self.actor.__ray_ready__.remote()

    def poll(self, ref) -> Answer | None:
        import ray
        from ray.exceptions import ActorUnavailableError, RayActorError

        if not ray.wait([ref], timeout=0)[0]:
            return None
        try:
            ray.get(ref)
            return Answer()
        except RayActorError as err:  # the actor is dead, unless Ray says it is only out of reach for now
            return Answer(error=_first_line(err), gone=not isinstance(err, ActorUnavailableError))
        except Exception as err:  # Ray could not carry the call: a miss
            return Answer(error=_first_line(err))


def _first_line(err: Exception) -> str:
    lines = str(err).strip().splitlines()
    return f"{type(err).__name__}: {lines[0] if lines else ''}"


def _whereabouts(actor) -> tuple[str, str, str]:
    import ray

    context = ray.get_runtime_context()
    return context.get_node_id(), context.get_actor_id(), actor.sender_key()


def worker_config(spec: ClusterSpec, role: str, name: str) -> PrefillWorkerConfig | DecodeWorkerConfig:
    """What the worker `name` of `role`'s pool is configured with, the cluster key included."""
    if role == "prefill":
        return PrefillWorkerConfig(name, host=bind_host(spec), cluster_key=spec.cluster_key,
                                   router_key=spec.router_key, **grammar_limits(spec))  # fmt: skip
    return decode_config(spec, name)


def grammar_limits(spec: ClusterSpec) -> dict:
    """The worker config's grammar compile bounds, from the spec's `grammars`."""
    return dict(grammar_compile_timeout_s=spec.grammars.compile_timeout_s,
                max_grammar_compiles_waiting=spec.grammars.max_compiles_waiting)


def decode_config(spec: ClusterSpec, name: str) -> DecodeWorkerConfig:
    """With no prefill pool (colocated mode; the router sends no prefill worker) every prompt is prefilled here."""
    return DecodeWorkerConfig(name, host=bind_host(spec), kv_transfer_failure=spec.kv_transfer_failure,
                              local_prefill_threshold=COLOCATED_THRESHOLD if spec.prefill.replicas == 0 else 0,
                              cluster_key=spec.cluster_key, router_key=spec.router_key,
                              **grammar_limits(spec))  # fmt: skip


def bind_host(spec: ClusterSpec) -> str:
    """`data_plane: node_ip`: workers bind on their node's address, so other nodes reach them."""
    return NODE_IP if spec.data_plane == "node_ip" else "127.0.0.1"


def tp_names(namespace: str | None, worker: str, restarts: int) -> TPNames | None:
    """Every rank and the group named in the deployment's namespace, detached (None: unnamed)."""
    if namespace is None:
        return None
    return TPNames(lambda rank: detached(namespace, follower_name(worker, restarts, rank) if rank
                                         else rank0_name(worker, restarts)),
                   group_name(namespace, worker, restarts))  # fmt: skip


def launch(spec: ClusterSpec, role: str, name: str, restarts: int = 0, namespace: str | None = None,
           core_sets: tuple[tuple[int, ...], ...] = ()) -> PoolWorker:  # fmt: skip
    """Start one worker of `role`'s pool named `name`, placed as its pool says (TP=1: returns at once).

    With `namespace`, its actors (and placement group) are named there and detached (`cluster.actor_names`).
    `core_sets`: rank r runs on core_sets[r] alone (`cluster.core_map`); (): on every core."""
    pool, args = spec.pool(role), engine_args_for(spec, role)
    config = dataclasses.replace(worker_config(spec, role, name), core_sets=core_sets)
    actor_cls = ACTOR_CLASSES[role]
    if pool.tensor_parallel_size == 1:
        named = detached(namespace, rank0_name(name, restarts))
        rank0 = start_worker_actor(actor_cls, args, config, pool.torch_threads, **placement_options(pool), **named)
        return PoolWorker(name, role, rank0, restarts=restarts)
    bundle = {**pool.resources, **({"GPU": pool.num_gpus} if pool.num_gpus else {})}
    tp = start_tp_actors(actor_cls, args, config, pool.torch_threads, spec.health.start_timeout_s, bundle=bundle,
                         label_selector=dict(pool.node_labels) or None,
                         names=tp_names(namespace, name, restarts))  # fmt: skip
    return PoolWorker(name, role, tp.rank0, tp, restarts=restarts)
