"""Two real processes (gloo over loopback) run tiny models at tp_size 2: greedy tokens equal
tp_size 1 and transformers, with chunked prefill and prefix caching on, and
prompt logits agree with transformers within float tolerance.

One spawn runs every model in sequence (each spawn pays a torch import): llama
(GQA, one KV head per rank), qwen2 (qkv bias) and qwen3 (q/k norm, a single KV
head, so both ranks hold a replica of it).
"""

from __future__ import annotations

import json
import socket
import time
from contextlib import ExitStack
from pathlib import Path

import dataclasses

import pytest
import torch
import torch.multiprocessing as mp
from safetensors.torch import load_file, save_file

from engine import LLM, EngineArgs, SamplingParams
from engine.model_input import build_model_input
from engine.parallel.follower import TPFollower
from engine.scheduler import ScheduledRequest
from tests.conftest import hf_model
from tests.engine.test_parity import MAX_NEW, PROMPTS, _reference

TP = 2
ARCHS = ("llama", "qwen2", "qwen3")
# Chunks of 8 tokens split every prompt but the first; the second pass hits the prefix cache.
ENGINE_ARGS = dict(num_kv_blocks=64, max_num_batched_tokens=8, enable_prefix_caching=True)


def _free_ports(n: int) -> list[int]:
    with ExitStack() as stack:
        socks = [stack.enter_context(socket.socket()) for _ in range(n)]
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]


def _generate_twice(llm: LLM) -> tuple[list[list[int]], list[list[int]], list[int]]:
    params = SamplingParams(temperature=0.0, max_tokens=MAX_NEW, ignore_eos=True)
    prompts = [{"prompt_token_ids": p} for p in PROMPTS]
    first = llm.generate(prompts, params, use_tqdm=False)
    second = llm.generate(prompts, params, use_tqdm=False)
    tokens = lambda outs: [o.outputs[0].token_ids for o in outs]  # noqa: E731
    return tokens(first), tokens(second), [o.num_cached_tokens for o in second]


def _prompt_logits(engine) -> torch.Tensor:
    """Logits at every position of PROMPTS[3], through rank 0's runner (so every rank runs the forward)."""
    prompt = PROMPTS[3]
    engine.add_request("logits", {"prompt_token_ids": prompt}, SamplingParams(max_tokens=1))
    req = engine.requests["logits"]
    assert engine.kv_cache.allocate_slots(req, len(prompt))
    batch = build_model_input([ScheduledRequest.of(req, len(prompt))], engine.config.cache.block_size, "cpu")
    every_row = dataclasses.replace(batch, logits_indices=torch.arange(len(prompt)))
    logits = engine.runner.compute_logits(every_row)  # [num_tokens, vocab]
    engine.abort_request("logits")
    return logits


def _run_rank(rank: int, model_dirs: dict[str, str], ports: list[int], out_dir: str) -> None:
    torch.set_num_threads(1)  # two ranks share two cores
    report = {}
    for arch, port in zip(ARCHS, ports):
        tp_args = dict(tensor_parallel_size=TP, tensor_parallel_rank=rank, dist_init_addr=f"127.0.0.1:{port}")
        if rank == 0:
            llm = LLM(model_dirs[arch], **tp_args, **ENGINE_ARGS, dtype="float32")
            save_file({"logits": _prompt_logits(llm.engine)}, str(Path(out_dir, f"{arch}.logits")))
            first, second, cached = _generate_twice(llm)
            engine = llm.engine
            report[arch] = dict(
                first=first, second=second, cached=cached,
                all_blocks_free=engine.kv_cache.num_free_blocks == engine.runner.num_blocks,
                kv_heads=engine.runner.kv_caches[0][0].shape[2],
            )
            engine.shutdown()
        else:
            args = EngineArgs(model=model_dirs[arch], **tp_args, **ENGINE_ARGS, dtype="float32")
            follower = TPFollower(args.create_engine_config())
            kv_heads = follower.runner.kv_caches[0][0].shape[2]
            report[arch] = dict(steps=follower.run(), kv_heads=kv_heads)
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(report))


def _join(ranks, timeout_s: float) -> None:
    """Wait for every rank; re-raises a rank's exception; kills both ranks when they hang."""
    deadline = time.monotonic() + timeout_s
    while not ranks.join(timeout=max(0.1, deadline - time.monotonic())):
        if time.monotonic() > deadline:
            for process in ranks.processes:
                process.kill()
            pytest.fail(f"tensor-parallel ranks still running after {timeout_s} s")


def test_tp2_greedy_matches_tp1_and_transformers(tiny_model_dirs, tmp_path):
    args = (tiny_model_dirs, _free_ports(len(ARCHS)), str(tmp_path))
    ranks = mp.spawn(_run_rank, args=args, nprocs=TP, join=False, daemon=True)
    # The references are computed while the ranks load and run.
    expected = {arch: [list(r) for r in _reference(tiny_model_dirs[arch])] for arch in ARCHS}
    single = {arch: _generate_twice(LLM(tiny_model_dirs[arch], **ENGINE_ARGS, dtype="float32")) for arch in ARCHS}
    _join(ranks, timeout_s=300)
    rank0, rank1 = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(TP))
    for arch in ARCHS:
        got = rank0[arch]
        assert got["first"] == expected[arch], arch
        assert got["second"] == expected[arch], arch
        assert [got["first"], got["second"], got["cached"]] == [list(x) for x in single[arch]], arch
        assert all(c > 0 for c in got["cached"][1:]), (arch, got["cached"])  # prefix cache was hit
        assert got["all_blocks_free"], arch
        assert rank1[arch]["steps"] >= 2 * MAX_NEW, arch  # the follower ran the steps of both passes
        assert got["kv_heads"] == rank1[arch]["kv_heads"] == 1, arch  # each rank caches only its KV head
        with torch.inference_mode():
            ref = hf_model(tiny_model_dirs[arch])(torch.tensor([PROMPTS[3]])).logits[0]
        torch.testing.assert_close(load_file(tmp_path / f"{arch}.logits")["logits"], ref, atol=1e-4, rtol=1e-4)
