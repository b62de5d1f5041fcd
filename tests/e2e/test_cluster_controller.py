"""The controller on a simulated cluster of three nodes with different custom resources.

    head    {}                                   router + controller (this process)
    node A  {"gpu_a": 4}, label tier=prefill     prefill pool: TP=2, each rank asks gpu_a: 1 and the label
    node B  {"gpu_b": 2}                         decode pool: TP=1, asks gpu_b: 1 (room for two)

Workers land where their pool says (a tensor-parallel worker's placement group
keeps both its ranks there) and serve transformers' greedy text; a killed
worker is restarted by the controller and serves again, and one that dies
again soon after starting waits out a backoff first; scaling both pools up and
back down under a stream of requests drops none of them. The controller actor
killed with SIGKILL under a stream of requests costs none of them: the workers
outlive it, Ray restarts it, and it takes them over without restarting any.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import types

import httpx
import openai
import psutil
import pytest
from transformers import AutoTokenizer

from cluster.cli import main
from cluster.deployment import Deployment
from cluster.spec import parse_spec
from tests.conftest import hf_greedy
from tests.e2e.harness import wait_for
from tests.e2e.leftovers import left_behind

# Ray rewrites 127.0.0.1 into the host's outward address; 127.0.0.2 is loopback that it leaves alone.
HOST = "127.0.0.2"
PROMPT = [5, 17, 42, 99, 7, 64, 3, 250, 11]
GREEDY = dict(temperature=0, max_tokens=8, extra_body={"ignore_eos": True})


@pytest.fixture(scope="module")
def cluster(tiny_model_dirs):
    import ray
    from ray.cluster_utils import Cluster

    if ray.is_initialized():
        ray.shutdown()  # the shared local Ray of other modules; `ray_session` starts a new one after this module
    sim = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "node_ip_address": HOST,
                                                        "include_dashboard": False})  # fmt: skip
    node_a = sim.add_node(num_cpus=1, resources={"gpu_a": 4}, labels={"tier": "prefill"}, node_ip_address=HOST)
    node_b = sim.add_node(num_cpus=1, resources={"gpu_b": 2}, node_ip_address=HOST)
    ray.init(address=sim.address, _node_ip_address=HOST, logging_level="WARNING", log_to_driver=False,
             configure_logging=False)  # fmt: skip
    model_dir = tiny_model_dirs["llama"]
    spec = parse_spec({
        "model": model_dir,
        "data_plane": "node_ip",  # as on a real cluster: sockets on each node's Ray address (127.0.0.2 here)
        "engine": {"num_kv_blocks": 48, "max_model_len": 256},
        "router": {"port": 0, "served_model_name": "tiny"},
        "prefill": {"tensor_parallel_size": 2, "resources": {"gpu_a": 1}, "node_labels": {"tier": "prefill"},
                    "dtype": "float32"},
        "decode": {"resources": {"gpu_b": 1}, "dtype": "float32"},
        "health": {"interval_s": 0.2, "timeout_s": 10, "restart_backoff_s": 0.5},
    })  # fmt: skip
    deployment = Deployment(spec)
    try:
        deployment.start()
        client = openai.OpenAI(base_url=f"{deployment.url}/v1", api_key="unused", max_retries=0, timeout=60)
        expected = AutoTokenizer.from_pretrained(model_dir).decode(hf_greedy(model_dir, PROMPT, 8),
                                                                  skip_special_tokens=True)  # fmt: skip
        yield types.SimpleNamespace(deployment=deployment, controller=deployment.controller, client=client,
                                    expected=expected, node_a=node_a.node_id, node_b=node_b.node_id)  # fmt: skip
    finally:
        deployment.stop()
        ray.shutdown()
        sim.shutdown()


def _complete(c) -> str:
    return c.client.completions.create(model="tiny", prompt=PROMPT, **GREEDY).choices[0].text


def _nodes(c, role: str) -> list[str]:
    return [w["node_id"] for w in c.controller.status()["pools"][role]["workers"]]


def test_workers_land_where_their_pool_says_and_serve_greedy_text(cluster):
    import ray

    assert _nodes(cluster, "prefill") == [cluster.node_a]
    (prefill,) = cluster.controller.pool("prefill")
    assert ray.get(prefill.tp.followers[0].__ray_call__.remote(_node_of)) == cluster.node_a  # both TP ranks on A
    assert _nodes(cluster, "decode") == [cluster.node_b]
    assert _complete(cluster) == cluster.expected
    # The data plane listens on the nodes' Ray address, where other machines would reach it.
    (decode,) = cluster.controller.pool("decode")
    kv_address = ray.get(decode.rank0.__ray_call__.remote(lambda actor: actor.hosted.worker.receiver_address))
    assert kv_address.startswith(f"tcp://{HOST}:")
    assert cluster.deployment.app.state.router.dispatcher.stream.address.startswith(f"tcp://{HOST}:")
    # The cluster key reached the workers in their config, not in Ray's runtime_env (nor their environment);
    # the router knows each worker by the sender key it made itself.
    runtime_envs = ray.get(decode.rank0.__ray_call__.remote(_key_as_ray_sees_it))
    assert runtime_envs == ({}, None, True)
    registered = {w.name: w.sender_key for w in cluster.deployment.app.state.router.registry.workers.values()}
    assert registered == {w.name: ray.get(w.rank0.sender_key.remote()) for w in (prefill, decode)}
    assert len(set(registered.values())) == 2 and all(registered.values())


def _key_as_ray_sees_it(actor) -> tuple:
    import os

    import ray

    from wire.socket_security import process_key

    env_vars = ray.get_runtime_context().runtime_env.get("env_vars", {})
    return env_vars, os.environ.get("TANDEM_CLUSTER_KEY"), process_key() is not None


def test_a_killed_worker_is_restarted_and_serves_again(cluster):
    """Prefill is a TP group: killing its follower replaces the whole group (rank 0's death takes the path
    decode's does). Decode is killed twice: its second death comes soon after its restart, so the controller
    waits out a backoff first."""
    import ray

    for role, deaths in (("prefill", 1), ("decode", 2)):
        for restarts in range(1, deaths + 1):
            (worker,) = cluster.controller.pool(role)
            victim = worker.tp.followers[0] if role == "prefill" else worker.rank0
            ray.kill(victim, no_restart=True)
            wait_for(lambda: _restarted(cluster, worker.name, restarts), f"{worker.name} to come back", timeout_s=120)
            (new,) = cluster.controller.pool(role)
            assert new.rank0 != worker.rank0 and new.node_id == worker.node_id
            assert _complete(cluster) == cluster.expected  # one worker per pool: this went through the new one
    events = cluster.controller.status()["events"]
    assert any("decode-0 is dead" in e and "restarting in 0.5 s (1 quick deaths in a row)" in e for e in events)


def _restarted(cluster, name: str, restarts: int) -> bool:
    worker = cluster.controller.workers.get(name)
    return worker is not None and worker.restarts == restarts and cluster.deployment.app.state.router.ready()


def test_scaling_up_and_down_under_a_stream_of_requests_drops_none(cluster, capsys):
    """Up with `tandem scale`, down over the admin endpoint, then `tandem status --json`."""
    results, stop = [], threading.Event()

    def client_loop():
        while not stop.is_set():
            try:
                results.append(_complete(cluster))
            except Exception as err:  # every failure is counted, none hidden
                results.append(err)

    clients = [threading.Thread(target=client_loop) for _ in range(2)]
    for thread in clients:
        thread.start()
    try:
        wait_for(lambda: len(results) >= 2, "the stream to start")
        main(["scale", "--url", cluster.deployment.url, "--prefill", "2", "--decode", "2"])
        assert "prefill: 2/2 workers" in capsys.readouterr().out
        assert sorted(_nodes(cluster, "decode")) == [cluster.node_b] * 2
        assert sorted(_nodes(cluster, "prefill")) == [cluster.node_a] * 2
        seen = len(results)
        wait_for(lambda: len(results) >= seen + 4, "requests on the larger pools")
        admin = {"Authorization": f"Bearer {cluster.deployment.admin_token}"}
        scaled = httpx.post(f"{cluster.deployment.url}/admin/scale", json={"prefill": 1, "decode": 1}, timeout=300,
                            headers=admin)  # fmt: skip
        assert scaled.status_code == 200, scaled.text
        seen = len(results)
        wait_for(lambda: len(results) >= seen + 2, "requests after scaling down")
    finally:
        stop.set()
        for thread in clients:
            thread.join(120)
    assert [r for r in results if r != cluster.expected] == []
    main(["status", "--url", cluster.deployment.url, "--json"])
    pools = json.loads(capsys.readouterr().out)["pools"]
    assert [len(pools[role]["workers"]) for role in ("prefill", "decode")] == [1, 1]
    assert all(w["alive"] and not w["draining"] for pool in pools.values() for w in pool["workers"])


def test_killing_the_controller_loses_no_request_and_restarts_no_worker(cluster):
    deployment, registry = cluster.deployment, cluster.deployment.app.state.router.registry
    before = {w.name: (w.actor_id, w.restarts) for w in cluster.controller.members()[1]}
    held = dict(registry.workers)  # the router's entries: the same objects after, or a worker was re-registered
    results, stop = [], threading.Event()

    def client_loop():
        while not stop.is_set():
            try:
                chunks = cluster.client.completions.create(model="tiny", prompt=PROMPT, stream=True, **GREEDY)
                results.append("".join(chunk.choices[0].text for chunk in chunks))
            except Exception as err:  # every failure is counted, none hidden
                results.append(err)

    clients = [threading.Thread(target=client_loop) for _ in range(3)]
    for thread in clients:
        thread.start()
    try:
        wait_for(lambda: len(results) >= 3, "the streams to start")
        os.kill(_controller_pid(deployment), signal.SIGKILL)
        seen = len(results)
        wait_for(lambda: len(results) >= seen + 6, "streams while the controller is down and back", timeout_s=120)
        events = cluster.controller.status()["events"]  # answers once Ray restarted it
    finally:
        stop.set()
        for thread in clients:
            thread.join(120)
    assert [r for r in results if r != cluster.expected] == []
    assert events[-1].endswith("controller restarted: adopted 2 serving workers, 0 to replace"), events
    assert {w.name: (w.actor_id, w.restarts) for w in cluster.controller.members()[1]} == before
    wait_for(lambda: deployment.app.state.router.ready(), "the router to sync with the new controller")
    assert all(registry.workers.get(name) is state and state.alive for name, state in held.items())
    cluster.controller.scale({"decode": 2})  # the restarted controller scales, from the sizes it kept
    assert sorted(_nodes(cluster, "decode")) == [cluster.node_b] * 2
    cluster.controller.scale({"decode": 1})
    assert [len(cluster.controller.pool(role)) for role in ("prefill", "decode")] == [1, 1]
    assert _complete(cluster) == cluster.expected


def test_a_worker_that_died_while_the_controller_was_down_is_replaced_by_the_next_controller(cluster):
    import ray
    from ray.exceptions import RayActorError

    (prefill,) = cluster.controller.pool("prefill")
    pid = _controller_pid(cluster.deployment)
    os.kill(pid, signal.SIGSTOP)  # frozen: it cannot see what follows
    try:
        follower = prefill.tp.followers[0]
        ray.kill(follower, no_restart=True)
        with pytest.raises(RayActorError):
            ray.get(follower.__ray_ready__.remote(), timeout=60)
    finally:
        os.kill(pid, signal.SIGKILL)
    wait_for(lambda: _restarted(cluster, "prefill-0", prefill.restarts + 1), "prefill-0 to come back", timeout_s=180)
    events = cluster.controller.status()["events"]
    assert any("controller restarted: adopted 1 serving workers, 1 to replace" in e for e in events), events
    assert any("prefill-0 is dead (found broken after the controller's restart: missing" in e for e in events)
    assert _complete(cluster) == cluster.expected


def test_a_deployment_whose_serving_process_died_ends_itself(cluster):
    """A second controller, serving no router, watches a process the test then kills (as `tandem serve`
    killed with SIGKILL on a Ray cluster that goes on): its detached worker and itself end."""
    import ray

    from cluster.actor_names import CONTROLLER, detached, new_namespace
    from cluster.controller_actor import ControllerActor
    from cluster.orphans import ServingProcess
    from cluster.spec import with_overrides

    spec = with_overrides(cluster.deployment.spec, {"prefill.replicas": 0, "health.timeout_s": 1})
    serving = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    namespace = new_namespace()
    try:
        watched = ServingProcess(serving.pid, psutil.Process(serving.pid).create_time())
        actor = ray.remote(ControllerActor).options(num_cpus=0, max_concurrency=4, **detached(namespace, CONTROLLER))
        controller = actor.remote(spec, namespace, watched)
        ray.get(controller.start.remote(), timeout=300)
        assert sorted(left_behind(namespace)) == ["controller", "decode-0@0"]
    finally:
        serving.kill()
        serving.wait()
    wait_for(lambda: left_behind(namespace) == [], "the orphaned deployment to end", timeout_s=120)


def test_stopping_with_the_controller_dead_for_good_leaves_no_worker_behind(cluster):
    """The last test: the workers are detached (they outlived the controller above); nobody but the
    deployment's stop would kill them once the controller cannot."""
    import ray

    deployment = cluster.deployment
    assert left_behind(deployment.namespace)  # the workers, named in the deployment's namespace
    ray.kill(deployment.controller.handle, no_restart=True)
    deployment.stop()
    assert left_behind(deployment.namespace) == []


def _controller_pid(deployment) -> int:
    import ray

    return ray.get(deployment.controller.handle.__ray_call__.remote(lambda _actor: os.getpid()))


def _node_of(_actor) -> str:
    import ray

    return ray.get_runtime_context().get_node_id()
