"""Two real processes (gloo over loopback) run tiny models at tp_size 2: greedy tokens equal
tp_size 1 and transformers, with chunked prefill and prefix caching on.

One spawn runs every model in sequence (each spawn pays a torch import): llama
(GQA, one KV head per rank), qwen2 (qkv bias) and qwen3 (q/k norm, a single KV
head, so both ranks hold a replica of it).
"""

from __future__ import annotations

import json
import socket
from contextlib import ExitStack
from pathlib import Path

import torch
import torch.multiprocessing as mp

from engine import LLM, EngineArgs, SamplingParams
from engine.parallel.follower import TPFollower
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


def _run_rank(rank: int, model_dirs: dict[str, str], ports: list[int], out_dir: str) -> None:
    torch.set_num_threads(1)  # two ranks share two cores
    report = {}
    for arch, port in zip(ARCHS, ports):
        tp_args = dict(tensor_parallel_size=TP, tensor_parallel_rank=rank, dist_init_addr=f"127.0.0.1:{port}")
        if rank == 0:
            llm = LLM(model_dirs[arch], **tp_args, **ENGINE_ARGS)
            first, second, cached = _generate_twice(llm)
            engine = llm.engine
            report[arch] = dict(
                first=first, second=second, cached=cached,
                all_blocks_free=engine.kv_cache.num_free_blocks == engine.runner.num_blocks,
                kv_heads=engine.runner.kv_caches[0][0].shape[2],
            )
            engine.shutdown()
        else:
            args = EngineArgs(model=model_dirs[arch], **tp_args, **ENGINE_ARGS)
            follower = TPFollower(args.create_engine_config())
            kv_heads = follower.runner.kv_caches[0][0].shape[2]
            report[arch] = dict(steps=follower.run(), kv_heads=kv_heads)
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(report))


def test_tp2_greedy_matches_tp1_and_transformers(tiny_model_dirs, tmp_path):
    ranks = mp.spawn(_run_rank, args=(tiny_model_dirs, _free_ports(len(ARCHS)), str(tmp_path)), nprocs=TP, join=False)
    # The references are computed while the ranks load and run.
    expected = {arch: [list(r) for r in _reference(tiny_model_dirs[arch])] for arch in ARCHS}
    single = {arch: _generate_twice(LLM(tiny_model_dirs[arch], **ENGINE_ARGS)) for arch in ARCHS}
    while not ranks.join(timeout=300):  # raises if a rank raised; timeout only bounds each wait
        pass
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
