"""`tandem serve` as a user runs it: a subprocess with an embedded local Ray, a tiny model, a free port.

It chooses its layout for the machine (one colocated worker on every core, no GPU
here), answers the official `openai` client with transformers' greedy text, and
SIGTERM drains it (new requests 503, the streams in flight end with their full
text), then ends it with status 0 and takes every process it started (Ray's
included) down with it. When its Ray cluster is killed under it, it says so and
exits with status 1 instead of serving nothing forever.
"""

from __future__ import annotations

import contextlib
import os
import threading
from concurrent.futures import ThreadPoolExecutor
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import openai
import psutil
from transformers import AutoTokenizer

from cluster.ray_leftovers import running
from tests.conftest import hf_greedy
from tests.e2e.harness import wait_for

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _wait_healthy(proc: subprocess.Popen, url: str, timeout_s: float = 240.0) -> None:
    import httpx

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"tandem serve exited with {proc.returncode}"
        try:
            if httpx.get(f"{url}/health", timeout=5).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.25)
    raise AssertionError("tandem serve never became healthy")


def _serve(model_dir: str, port: int, log) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env.update(PYTHONPATH=os.pathsep.join(filter(None, [ROOT, env.get("PYTHONPATH")])), TANDEM_LOG_LEVEL="WARNING")
    command = [sys.executable, "-m", "cluster.cli", "serve", "--model", model_dir, "--served-model-name", "tiny",
               "--port", str(port), "--num-kv-blocks", "512", "--max-model-len", "256",
               "--dtype", "float32"]  # fmt: skip
    return subprocess.Popen(command, env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)


def _output(proc: subprocess.Popen, log) -> str:
    if proc.poll() is None:
        proc.kill()
        proc.wait()
    log.seek(0)
    output = log.read()
    log.close()
    return output


def _all_ended(started: list[psutil.Process], timeout_s: float = 30.0) -> list[int]:
    """The pids of `started` still running after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while (left := [p for p in started if running(p)]) and time.monotonic() < deadline:
        time.sleep(0.2)
    return [p.pid for p in left]


def test_serve_answers_openai_then_sigterm_drains_and_stops_everything(tiny_model_dirs, tmp_path):
    model_dir, port = tiny_model_dirs["llama"], _free_port()
    url = f"http://127.0.0.1:{port}"
    log = open(tmp_path / "serve.log", "w+")
    proc = _serve(model_dir, port, log)
    try:
        _wait_healthy(proc, url)
        started = psutil.Process(proc.pid).children(recursive=True)
        assert started, "an embedded Ray runs under tandem serve"
        assert _decode_worker_niceness(started) == [0]  # not Ray's default 15 (runtime.priority)
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=60)
        prompt = [5, 17, 42, 99, 7, 64]
        out = client.completions.create(model="tiny", prompt=prompt, temperature=0, max_tokens=8,
                                        extra_body={"ignore_eos": True})  # fmt: skip
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        expected = tokenizer.decode(hf_greedy(model_dir, prompt, 8), skip_special_tokens=True)
        assert out.choices[0].text == expected
        streams = _drained_streams(proc, url, prompt, count=32, max_tokens=160)
        expected = tokenizer.decode(hf_greedy(model_dir, prompt, 160), skip_special_tokens=True)
        assert streams == [(expected, 160)] * 32  # every stream in flight at SIGTERM ended with its full text
        assert proc.wait(timeout=120) == 0
    finally:
        output = _output(proc, log)
    assert "serving tiny at" in output and "tandem: draining" in output and "tandem: stopped" in output, output
    assert "still in flight" not in output, output
    assert "layout: 1 worker that prefills and decodes on all" in output, output  # one machine, no GPU
    assert not _all_ended(started), "still running after tandem serve ended"
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # closed connections may linger in TIME_WAIT
        sock.bind(("127.0.0.1", port))  # nothing listens on the router's port any more
        sock.listen()


def _drained_streams(proc: subprocess.Popen, url: str, prompt: list[int], count: int,
                     max_tokens: int) -> list[tuple[str, int]]:  # fmt: skip
    """`count` streams started, SIGTERM once each has its first token; while they run, /health fails and a new
    request is refused with 503. Each stream's (text, completion tokens)."""
    import httpx

    first_tokens = [threading.Event() for _ in range(count)]
    with ThreadPoolExecutor(count) as pool:
        futures = [pool.submit(_stream, url, prompt, max_tokens, first) for first in first_tokens]
        assert all(first.wait(120) for first in first_tokens)
        proc.send_signal(signal.SIGTERM)
        wait_for(lambda: httpx.get(f"{url}/health", timeout=5).status_code == 503, "/health to fail", timeout_s=60)
        refused = httpx.post(f"{url}/v1/completions", json={"model": "tiny", "prompt": prompt, "max_tokens": 4},
                             timeout=30)  # fmt: skip
        assert refused.status_code == 503 and refused.json()["error"]["code"] == "shutting_down"
        assert not all(f.done() for f in futures), "the streams ended before the drain could be seen"
        return [f.result() for f in futures]


def _stream(url: str, prompt: list[int], max_tokens: int, first_token: threading.Event) -> tuple[str, int]:
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=120)
    text, tokens = "", 0
    for chunk in client.completions.create(model="tiny", prompt=prompt, temperature=0, max_tokens=max_tokens,
                                           stream=True, stream_options={"include_usage": True},
                                           extra_body={"ignore_eos": True}):  # fmt: skip
        if chunk.choices:
            text += chunk.choices[0].text
            first_token.set()
        if chunk.usage:
            tokens = chunk.usage.completion_tokens
    return text, tokens


def test_serve_exits_non_zero_when_its_ray_cluster_is_killed(tiny_model_dirs, tmp_path):
    port = _free_port()
    log = open(tmp_path / "serve.log", "w+")
    proc = _serve(tiny_model_dirs["llama"], port, log)
    try:
        _wait_healthy(proc, f"http://127.0.0.1:{port}")
        # The router answers /health before `tandem serve` has finished starting (its last calls through
        # Ray): kill Ray once it serves, which is what this test is about.
        _wait_for_line(proc, log, "tandem: serving")
        started = _kill_ray(proc)
        assert proc.wait(timeout=180) == 1
    finally:
        output = _output(proc, log)
    assert "tandem: the Ray cluster is gone" in output and "tandem: error: the Ray cluster is gone" in output, output
    assert not _all_ended(started, timeout_s=10), "still running after tandem serve ended"


def test_serve_exits_non_zero_when_its_ray_cluster_is_killed_while_it_starts(tiny_model_dirs, tmp_path):
    log = open(tmp_path / "serve.log", "w+")
    proc = _serve(tiny_model_dirs["llama"], _free_port(), log)
    try:
        _wait_for_line(proc, log, "; layout: ")  # Ray is up; the controller and the workers are yet to start
        started = _kill_ray(proc)
        # Its start-up calls through Ray would wait for Ray's own exit (60 s, with Ray's message): the lifeline
        # ends them in a few seconds, with ours.
        assert proc.wait(timeout=50) == 1
    finally:
        output = _output(proc, log)
    assert "tandem: serving" not in output, output  # it never got to serve
    assert "tandem: the Ray cluster is gone" in output and "tandem: error: the Ray cluster is gone" in output, output
    assert not _all_ended(started, timeout_s=10), "still running after tandem serve ended"


def _wait_for_line(proc: subprocess.Popen, log, text: str, timeout_s: float = 120) -> None:
    def printed() -> bool:
        assert proc.poll() is None, f"tandem serve exited with {proc.returncode} before {text!r}"
        return text in Path(log.name).read_text()

    wait_for(printed, f"{text!r} from tandem serve", timeout_s)


def _kill_ray(proc: subprocess.Popen) -> list[psutil.Process]:
    """SIGKILL the embedded Ray's GCS and raylet (its workers go with them); returns what ran under `proc`."""
    started = psutil.Process(proc.pid).children(recursive=True)
    ray_core = [p for p in started if p.name() in ("gcs_server", "raylet")]
    assert len(ray_core) == 2, [p.name() for p in started]
    for process in ray_core:
        process.kill()
    return started


def _decode_worker_niceness(processes: list[psutil.Process]) -> list[int]:
    """The niceness of each decode worker process among `processes` (its title names its actor class)."""
    found = []
    for process in processes:
        with contextlib.suppress(psutil.Error):
            if "DecodeActor" in " ".join(process.cmdline()):
                found.append(process.nice())
    return found

