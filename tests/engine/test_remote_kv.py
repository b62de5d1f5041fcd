"""Engine roles without workers: a prefill engine's KV copied block by block into a decode engine's reservation.

The copy stands in for the KV transfer (tested in tests/kvtransfer); the engines,
schedulers and block pools are the real ones. Every path ends with both pools all free.
"""

from __future__ import annotations

import pytest
import torch

from engine import EngineArgs, LLMEngine, SamplingParams
from engine.remote_kv import (
    NoFreeBlocks,
    add_prefill_request,
    admit_remote_kv,
    fail_remote_kv,
    release_blocks,
    reserve_remote_kv,
    waiting_for_kv,
)
from engine.request import RequestStatus
from tests.conftest import hf_greedy

GREEDY = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
_BASE = [(11 * i + 5) % 380 + 3 for i in range(80)]
SHARED = _BASE[:36]  # two full blocks of 16 shared by the prompts below


def _engine(model_dir: str, num_blocks: int = 32, **kwargs) -> LLMEngine:
    args = EngineArgs(model=model_dir, num_kv_blocks=num_blocks, max_model_len=128, **kwargs, dtype="float32")
    return LLMEngine.from_args(args, show_progress=False)


@pytest.fixture(scope="module")
def engines(tiny_model_dirs):
    return _engine(tiny_model_dirs["llama"]), _engine(tiny_model_dirs["llama"])


def _all_free(engine: LLMEngine) -> bool:
    return engine.kv_cache.num_free_blocks == engine.kv_cache.pool.num_blocks and not engine.requests


def _run(engine: LLMEngine) -> dict[str, list[int]]:
    tokens: dict[str, list[int]] = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            tokens.setdefault(out.request_id, []).extend(out.new_token_ids)
    return tokens


def _copy_blocks(src: LLMEngine, src_ids, dst: LLMEngine, dst_ids) -> None:
    for (k_src, v_src), (k_dst, v_dst) in zip(src.runner.kv_caches, dst.runner.kv_caches):
        k_dst[list(dst_ids)] = k_src[list(src_ids)]
        v_dst[list(dst_ids)] = v_src[list(src_ids)]


def _disaggregated(prefill: LLMEngine, decode: LLMEngine, prompts: dict[str, list[int]]) -> dict[str, list[int]]:
    """Reserve on decode, prefill, copy only the blocks decode lacks, admit, decode to the end."""
    reservations = {rid: reserve_remote_kv(decode, rid, p, GREEDY) for rid, p in prompts.items()}
    held = {rid: add_prefill_request(prefill, rid, p, GREEDY) for rid, p in prompts.items()}
    first = {rid: toks[0] for rid, toks in _run(prefill).items()}
    assert not prefill.requests and all(req.status == RequestStatus.FINISHED_LENGTH for req in held.values())
    outputs = {}
    for rid, res in reservations.items():
        src_ids = [b.block_id for b in held[rid].blocks[res.num_cached_blocks :]]
        _copy_blocks(prefill, src_ids, decode, res.transfer_block_ids)
        release_blocks(prefill, held[rid])
        outputs[rid] = admit_remote_kv(decode, rid, first[rid]).new_token_ids
    for rid, toks in _run(decode).items():
        outputs[rid] += toks
    return outputs


def test_disaggregated_roles_match_transformers_and_free_everything(engines, tiny_model_dirs):
    prefill, decode = engines
    prompts = {"a": SHARED + [7, 8, 9], "b": _BASE[40:45], "c": SHARED + _BASE[50:70]}
    outputs = _disaggregated(prefill, decode, prompts)
    for rid, prompt in prompts.items():
        assert outputs[rid] == hf_greedy(tiny_model_dirs["llama"], prompt, GREEDY.max_tokens), rid
    assert _all_free(prefill) and _all_free(decode)
    # Both sides cached the shared prefix: a later prompt hits on each, so fewer blocks move.
    again = {"d": SHARED + [30, 31]}
    res = reserve_remote_kv(decode, "probe", again["d"], GREEDY)
    assert res.num_cached_blocks == 2 and len(res.transfer_block_ids) == 1
    fail_remote_kv(decode, "probe")
    outputs = _disaggregated(prefill, decode, again)
    assert outputs["d"] == hf_greedy(tiny_model_dirs["llama"], again["d"], GREEDY.max_tokens)
    assert _all_free(prefill) and _all_free(decode)


def test_held_blocks_serve_prefix_hits_until_released(engines):
    prefill, _ = engines
    first = add_prefill_request(prefill, "first", SHARED + [1, 2], GREEDY)
    _run(prefill)
    assert len(first.blocks) == 3 and prefill.kv_cache.num_free_blocks == 32 - 3
    second = add_prefill_request(prefill, "second", SHARED + [3], GREEDY)
    _run(prefill)
    assert second.num_cached_tokens == 32  # hit the two full blocks the first still holds
    release_blocks(prefill, first)
    release_blocks(prefill, second)
    release_blocks(prefill, second)  # idempotent
    assert _all_free(prefill)


def test_prefill_abort_keeps_blocks_for_the_caller(engines):
    prefill, _ = engines
    req = add_prefill_request(prefill, "x", _BASE[:30], GREEDY)
    prefill.scheduler.schedule()  # allocated, as if a step were under way
    assert prefill.abort_request("x")
    assert req.blocks and prefill.kv_cache.num_free_blocks < 32
    release_blocks(prefill, req)
    assert _all_free(prefill)


def test_waiting_for_kv_does_not_stall_others_and_failure_frees(engines):
    _, decode = engines
    res = reserve_remote_kv(decode, "remote", _BASE[:40], GREEDY)
    assert waiting_for_kv(decode) == ["remote"] and len(res.block_ids) == 3
    decode.add_request("local", _BASE[:9], GREEDY)
    assert list(_run(decode)) == ["local"]  # ran to the end while "remote" waited
    with pytest.raises(ValueError, match="not waiting"):
        decode.add_request("running", _BASE[:4], GREEDY)
        decode.step()
        admit_remote_kv(decode, "running", 5)
    decode.abort_request("running")
    assert fail_remote_kv(decode, "remote")
    assert _all_free(decode)


def test_decode_full_raises_no_free_blocks_and_keeps_nothing(tiny_model_dirs):
    decode = _engine(tiny_model_dirs["llama"], num_blocks=4)
    reserve_remote_kv(decode, "big", _BASE[:50], GREEDY)  # 4 blocks: all of them
    with pytest.raises(NoFreeBlocks, match="free KV blocks"):
        reserve_remote_kv(decode, "more", _BASE[:20], GREEDY)
    assert list(decode.requests) == ["big"]
    fail_remote_kv(decode, "big")
    assert _all_free(decode)


def test_first_token_can_finish_the_request(engines):
    _, decode = engines
    reserve_remote_kv(decode, "one", _BASE[:10], SamplingParams(temperature=0, max_tokens=1))
    out = admit_remote_kv(decode, "one", 42)
    assert out.finished and out.outputs[0].finish_reason == "length" and out.new_token_ids == [42]
    assert _all_free(decode)


def test_connector_sees_the_forward_then_each_layer_final_during_it(tiny_model_dirs):
    prefill = _engine(tiny_model_dirs["llama"])
    req = add_prefill_request(prefill, "r", _BASE[:40], GREEDY)
    seen = []  # ("forward", requests it completes) then (layer, copy of every layer's blocks of the request)

    class Connector:
        def before_forward(self, sched):
            seen.append(("forward", [s.request.request_id for s in sched.scheduled if s.samples]))
            return b""

        def save_layer(self, layer):
            ids = [b.block_id for b in req.blocks]
            seen.append((layer, [k[ids].clone() for k, _ in prefill.runner.kv_caches]))

    prefill.kv_connector = Connector()
    _run(prefill)
    ids = [b.block_id for b in req.blocks]
    final = [k[ids] for k, _ in prefill.runner.kv_caches]
    assert [event for event, _ in seen] == ["forward", 0, 1]  # one forward, layers in order
    _, (_, at_layer_0), (_, at_layer_1) = seen
    assert seen[0][1] == ["r"]
    assert torch.equal(at_layer_0[0], final[0]) and not torch.equal(at_layer_0[1], final[1])  # 1 not yet written
    assert torch.equal(at_layer_1[1], final[1])
    release_blocks(prefill, req)


def test_admission_waits_for_a_seat(tiny_model_dirs):
    decode = _engine(tiny_model_dirs["llama"], max_num_seqs=1)
    decode.add_request("busy", _BASE[:5], GREEDY)
    decode.step()
    reserve_remote_kv(decode, "landed", _BASE[:20], GREEDY)
    assert admit_remote_kv(decode, "landed", 7) is None  # the one seat is taken: still waiting for it
    assert waiting_for_kv(decode) == ["landed"]
    _run(decode)
    out = admit_remote_kv(decode, "landed", 7)
    assert out.new_token_ids == [7] and not waiting_for_kv(decode)
    _run(decode)
    assert _all_free(decode)
