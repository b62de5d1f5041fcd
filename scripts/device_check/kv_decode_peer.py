"""The decode side of the KV step: an engine in its own process that reserves blocks, takes KV in, decodes.

Started by device_check.kv_engines through the launcher; talks JSON lines (stdin in, `peer: ` lines on
stdout out). Per request: `reserve` binds a KVReceiver on the given address (one per transport),
reserves the prompt's blocks (prefix hits kept) and answers where the KV goes, then polls until the
transfer ends; `admit` answers that end, a digest of the landed blocks (taken before decoding writes
into the last one) and the tokens decoded from the first token on.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys

import torch

TIMEOUT_POLLS = 1200  # of 50 ms: a transfer of a few blocks takes milliseconds


def reply(**fields) -> None:
    print("peer: " + json.dumps(fields), flush=True)


def blocks_digest(kv_caches, block_ids) -> str:
    """sha256 of these blocks' bytes, layer by layer, K then V: equal on both sides iff the KV arrived intact."""
    digest = hashlib.sha256()
    index = torch.tensor(list(block_ids), dtype=torch.long, device=kv_caches[0][0].device)
    for k, v in kv_caches:
        for cache in (k, v):
            digest.update(cache.index_select(0, index).cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def make_engine(model_dir: str, device: str):
    from engine import EngineArgs, LLMEngine

    args = EngineArgs(model=model_dir, device=device, dtype="float32", num_kv_blocks=64, max_model_len=256,
                      attention_backend="triton")  # fmt: skip
    return LLMEngine.from_args(args, show_progress=False)


def run_to_end(engine) -> dict[str, list[int]]:
    tokens: dict[str, list[int]] = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            tokens.setdefault(out.request_id, []).extend(out.new_token_ids)
    return tokens


class DecodePeer:
    def __init__(self, model_dir: str, device: str):
        from runtime.engine_bridge import kv_spec_for

        self.engine = make_engine(model_dir, device)
        self.spec = kv_spec_for(self.engine.config)
        self.ended: dict[str, tuple[str, str, str]] = {}  # request id -> (event kind, reason, digest)

    def reserve(self, rid: str, prompt: list[int], max_tokens: int, address: str) -> None:
        from engine import SamplingParams
        from engine.remote_kv import reserve_remote_kv
        from kvtransfer import KVReceiver

        receiver = KVReceiver(self.engine.runner.kv_caches, self.spec, address)
        params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
        res = reserve_remote_kv(self.engine, rid, {"prompt_token_ids": prompt}, params)
        receiver.recv(rid, res.transfer_block_ids)
        reply(address=receiver.address, block_ids=list(res.transfer_block_ids), num_cached_blocks=res.num_cached_blocks)
        for _ in range(TIMEOUT_POLLS):
            events = [e for e in receiver.poll(50) if e.request_id == rid]
            if events:
                digest = blocks_digest(self.engine.runner.kv_caches, res.transfer_block_ids)
                self.ended[rid] = (events[0].kind, events[0].reason, digest)
                break
        else:
            self.ended[rid] = ("timeout", f"no transfer event in {TIMEOUT_POLLS * 0.05:.0f} s", "")
        receiver.close()

    def admit(self, rid: str, first: int) -> None:
        from engine.remote_kv import admit_remote_kv, fail_remote_kv

        kind, reason, digest = self.ended.pop(rid)
        if kind != "done":
            fail_remote_kv(self.engine, rid)
            reply(event=kind, reason=reason, digest=digest, tokens=[])
            return
        tokens = list(admit_remote_kv(self.engine, rid, first).new_token_ids)
        tokens += run_to_end(self.engine).get(rid, [])
        reply(event=kind, reason=reason, digest=digest, tokens=tokens)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", required=True)
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args()
    peer = DecodePeer(args.model_dir, args.device)
    reply(ready=True)
    for line in sys.stdin:  # ends when the prefill side closes the pipe
        order = json.loads(line)
        getattr(peer, order.pop("op"))(**order)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
