"""`tandem serve --address` on a Ray cluster of two hosts with separate network stacks (network namespaces).

    host a  10.x.y.2  Ray head {"gpu_b": 1}, `tandem serve` (router, controller), the decode worker
    host b  10.x.y.3  Ray worker node {"gpu_a": 1}: the prefill worker
    this test         the bridge's 10.x.y.1: the openai client, as a user elsewhere on the network

Nothing is on a shared loopback: the prefill worker on b reaches decode's KV
socket and the router's token stream on a only through their host addresses
(`data_plane: node_ip`, chosen by `--address`), as on real machines. The
request comes back as transformers' greedy text, `tandem status` shows each
pool on its host, and SIGINT stops `tandem serve` cleanly.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys

import openai
import pytest
from transformers import AutoTokenizer

from tests.conftest import hf_greedy
from tests.e2e import netns
from tests.e2e.test_tandem_serve import ROOT, _wait_healthy

RAY_PORT, HTTP_PORT = 6379, 8000  # each host has its own ports: no clash with anything on this machine
RAY_TEMP_DIR = f"/tmp/tdm{os.getpid()}"  # short: Ray's unix socket paths must fit in 107 bytes
PROMPT = [5, 17, 42, 99, 7, 64]

pytestmark = pytest.mark.skipif(netns.usable() is not None, reason=str(netns.usable()))


@pytest.fixture
def hosts():
    hosts = netns.NamespaceHosts(["a", "b"])
    try:
        yield hosts
    finally:
        hosts.close()
        shutil.rmtree(RAY_TEMP_DIR, ignore_errors=True)


def _env() -> dict:
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    # Ray's daemons pass PYTHONPATH on to the workers they start: they import Tandem from here.
    env.update(PYTHONPATH=os.pathsep.join(filter(None, [ROOT, env.get("PYTHONPATH")])), RAY_AUTH_MODE="disabled",
               TANDEM_LOG_LEVEL="WARNING", RAY_USAGE_STATS_ENABLED="0")  # fmt: skip
    return env


def _ray_start(hosts, name: str, resources: dict, *head_or_join: str) -> None:
    command = [os.path.join(os.path.dirname(sys.executable), "ray"), "start", *head_or_join,
               f"--node-ip-address={hosts.address[name]}", "--num-cpus=1", f"--resources={json.dumps(resources)}"]  # fmt: skip
    done = hosts.run(name, command, timeout_s=120, env=_env(), capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def test_serve_on_two_hosts_places_pools_by_resource_and_answers(hosts, tiny_model_dirs, tmp_path):
    model_dir, head = tiny_model_dirs["llama"], hosts.address["a"]
    _ray_start(hosts, "a", {"gpu_b": 1}, "--head", f"--port={RAY_PORT}", "--include-dashboard=false",
               f"--temp-dir={RAY_TEMP_DIR}")  # fmt: skip
    _ray_start(hosts, "b", {"gpu_a": 1}, f"--address={head}:{RAY_PORT}")
    spec = tmp_path / "spec.yaml"
    spec.write_text(json.dumps({"engine": {"num_kv_blocks": 48, "max_model_len": 256},
                                "prefill": {"resources": {"gpu_a": 1}}, "decode": {"resources": {"gpu_b": 1}}}))  # fmt: skip
    command = [sys.executable, "-m", "cluster.cli", "serve", "--address", f"{head}:{RAY_PORT}", "--config", str(spec),
               "--model", model_dir, "--served-model-name", "tiny", "--host", head, "--port", str(HTTP_PORT),
               "--dtype", "float32"]  # fmt: skip
    log = open(tmp_path / "serve.log", "w+")
    proc = hosts.popen("a", command, env=_env(), cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://{head}:{HTTP_PORT}"
    try:
        _wait_healthy(proc, url)
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=60)
        out = client.completions.create(model="tiny", prompt=PROMPT, temperature=0, max_tokens=8,
                                        extra_body={"ignore_eos": True})  # fmt: skip
        expected = AutoTokenizer.from_pretrained(model_dir).decode(hf_greedy(model_dir, PROMPT, 8),
                                                                  skip_special_tokens=True)  # fmt: skip
        assert out.choices[0].text == expected
        status = subprocess.run([sys.executable, "-m", "cluster.cli", "status", "--url", url, "--json"], env=_env(),
                                cwd=ROOT, capture_output=True, text=True, timeout=60)  # fmt: skip
        assert status.returncode == 0, status.stderr
        assert _hosts_of(json.loads(status.stdout)) == {"prefill": [hosts.address["b"]], "decode": [head]}
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=120) == 0
    finally:
        log.seek(0)
        output = log.read()
        log.close()
    assert "tandem: stopped" in output, output


def _hosts_of(status: dict) -> dict:
    address = {n["node_id"]: n["address"] for n in status["nodes"]}
    return {role: [address[w["node_id"]] for w in pool["workers"]] for role, pool in status["pools"].items()}
