"""KV transfer between two engines in two processes on one device, over each transport that works there.

    python -m device_check.launch device_check.kv_engines --device cuda --work DIR

This process is the prefill side: a tiny Llama engine prefills a prompt, holds its blocks, and a
KVSender sends them layer by layer into the blocks that a decode engine in another process
(device_check.kv_decode_peer) reserved; that engine then decodes from the first token. Passes when,
for every transport, the landed blocks are bit-identical to the sent ones and the tokens equal this
engine's own (not disaggregated) greedy tokens for the prompt. The second prompt shares two blocks
with the first, so decode keeps them from its prefix cache and only the rest moves.

On one GPU: ZMQ over IPC and over loopback TCP (CUDA blocks staged through pinned host memory). Not
here: NCCL needs two devices (one rank per GPU; tests/kvtransfer/test_gpu.py has the pair), gloo
moves CPU tensors only. Every transport needs pyzmq (the control messages are ZMQ even where the
tensors are not): without it the step is skipped, naming the wheel to carry.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import time
from pathlib import Path

from .step_io import figure, skip

TRANSPORTS = ("zmq-ipc", "zmq-tcp")
NOT_HERE = "NCCL needs two GPUs, gloo CPU tensors"
MAX_TOKENS = 8
_BASE = [(13 * i + 7) % 380 + 3 for i in range(80)]
PROMPTS = [_BASE[:40], _BASE[:32] + _BASE[50:61]]  # 2.5 blocks of 16; the second shares the first two


class PeerProcess:
    """The decode engine's process and its JSON-lines pipe; its other output goes to this step's log."""

    def __init__(self, model_dir: str, device: str):
        from .launch import command

        argv = command("device_check.kv_decode_peer", "--model-dir", model_dir, "--device", device)
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.read()  # ready

    def ask(self, **order) -> dict:
        self.proc.stdin.write(json.dumps(order) + "\n")
        self.proc.stdin.flush()
        return self.read()

    def read(self) -> dict:
        for line in self.proc.stdout:
            if line.startswith("peer: "):
                return json.loads(line.removeprefix("peer: "))
            print(line, end="")
        raise RuntimeError(f"the decode peer ended (status {self.proc.wait()}) before answering")

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=30)


def prefill(engine, rid: str, prompt: list[int]):
    """Run the prompt on the prefill role: its request holds its blocks; returns it and its first token."""
    from engine.remote_kv import add_prefill_request

    from .kv_decode_peer import run_to_end

    req = add_prefill_request(engine, rid, {"prompt_token_ids": prompt}, greedy())
    return req, run_to_end(engine)[rid][0]


def greedy():
    from engine import SamplingParams

    return SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)


def send(sender, engine, rid: str, src_ids: list[int], address: str, dst_ids: list[int]) -> float:
    """Send every layer of the blocks; seconds until the sender saw the end, or raise with its reason."""
    from kvtransfer import PeerTarget

    start = time.perf_counter()
    sender.send(rid, src_ids, PeerTarget(address, tuple(dst_ids)))
    for layer, (k, v) in enumerate(engine.runner.kv_caches):
        sender.send_layer(rid, layer, k, v)
    deadline = start + 60
    while time.perf_counter() < deadline:
        events = [e for e in sender.poll(10) if e.request_id == rid]
        if events:
            if events[0].kind != "done":
                raise RuntimeError(f"{rid}: the sender saw {events[0].kind}: {events[0].reason}")
            return time.perf_counter() - start
    raise RuntimeError(f"{rid}: no end of the transfer in 60 s")


def local_tokens(engine, rid: str, prompt: list[int]) -> list[int]:
    """The same engine's greedy tokens for the prompt, prefilled and decoded here."""
    from .kv_decode_peer import run_to_end

    engine.add_request(rid, {"prompt_token_ids": prompt}, greedy())
    return run_to_end(engine)[rid]


def one_transfer(engine, sender, peer: PeerProcess, transport: str, prompt: list[int], work: Path) -> list[str]:
    """Move one prompt's KV over `transport`; what went wrong (nothing: [])."""
    from engine.remote_kv import release_blocks

    from .kv_decode_peer import blocks_digest

    rid = f"kv-{transport}"
    address = f"ipc://{work}/kv-{transport}.sock" if transport == "zmq-ipc" else "tcp://127.0.0.1:0"
    where = peer.ask(op="reserve", rid=rid, prompt=prompt, max_tokens=MAX_TOKENS, address=address)
    req, first = prefill(engine, rid, prompt)
    num_blocks, src_ids = len(req.blocks), [b.block_id for b in req.blocks[where["num_cached_blocks"] :]]
    sent_digest = blocks_digest(engine.runner.kv_caches, src_ids)
    try:
        seconds = send(sender, engine, rid, src_ids, where["address"], where["block_ids"])
    finally:
        release_blocks(engine, req)
    landed = peer.ask(op="admit", rid=rid, first=first)
    nbytes = len(src_ids) * sum(k[0].nbytes + v[0].nbytes for k, v in engine.runner.kv_caches)
    kept = where["num_cached_blocks"]
    figure(transport, f"{len(src_ids)} of {num_blocks} blocks ({nbytes / 1e3:.0f} kB) in {seconds * 1e3:.1f} ms, "
                      f"{kept} kept from decode's prefix cache")  # fmt: skip
    expected = local_tokens(engine, f"{rid}-local", prompt)
    problems = []
    if landed["event"] != "done":
        problems.append(f"{transport}: the receiver saw {landed['event']}: {landed['reason']}")
    elif landed["digest"] != sent_digest:
        problems.append(f"{transport}: the landed blocks differ from the sent ones")
    elif landed["tokens"] != expected:
        problems.append(f"{transport}: decoded {landed['tokens']}, the engine alone {expected}")
    return problems


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--work", required=True)
    args = parser.parse_args()
    try:
        import zmq  # noqa: F401  (every transport's control messages)
    except ImportError:
        skip(f"pyzmq is not importable: carry its wheel (scripts/gpu_check_wheels.txt); {NOT_HERE}")
    from kvtransfer import KVSender
    from runtime.engine_bridge import kv_spec_for
    from tests.tiny_models import build_tiny_model

    from .kv_decode_peer import make_engine

    work = Path(args.work)
    model_dir = str(build_tiny_model(work / "kv-llama", "llama"))
    engine = make_engine(model_dir, args.device)
    sender = KVSender(kv_spec_for(engine.config), "gpu-check-prefill")
    peer = PeerProcess(model_dir, args.device)
    problems = [
        problem
        for transport, prompt in zip(TRANSPORTS, PROMPTS)
        for problem in one_transfer(engine, sender, peer, transport, prompt, work)
    ]
    peer.close()
    sender.close()
    figure("not on one GPU", NOT_HERE)
    for problem in problems:
        print(f"FAIL {problem}", flush=True)
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
