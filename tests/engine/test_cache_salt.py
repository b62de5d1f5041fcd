"""The prefix cache's tenant salt (vLLM's `cache_salt`) in the engine: a real LLMEngine and the decode role's
reservation. Different salts (or a salt and none) never share cached blocks, the same salt does, and no salt
keeps the hashes of before byte for byte."""

from __future__ import annotations

import pytest

from engine import EngineArgs, LLMEngine, SamplingParams
from engine.block_pool import hash_block_tokens, hash_token_blocks
from engine.remote_kv import add_prefill_request, count_uncached_tokens, fail_remote_kv, release_blocks, reserve_remote_kv

PROMPT = [(7 * i + 3) % 380 + 3 for i in range(40)]  # two full blocks of 16 and a partial one


def _params(salt: str | None = None) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=2, ignore_eos=True, cache_salt=salt)


@pytest.fixture
def engine(tiny_model_dirs) -> LLMEngine:
    args = EngineArgs(model=tiny_model_dirs["llama"], num_kv_blocks=32, max_model_len=128, dtype="float32")
    return LLMEngine.from_args(args, show_progress=False)


def _cached_tokens(engine: LLMEngine, rid: str, salt: str | None) -> int:
    """Run one request to the end; the prompt tokens it got from the prefix cache, as the engine reports them."""
    engine.add_request(rid, list(PROMPT), _params(salt))
    final = None
    while engine.has_unfinished_requests():
        for out in engine.step():
            final = out if out.finished else final
    return final.num_cached_tokens


def test_different_salts_never_share_blocks_the_same_salt_does(engine):
    assert _cached_tokens(engine, "a1", "tenant-a") == 0
    assert _cached_tokens(engine, "b1", "tenant-b") == 0  # same prompt, another tenant: no hit
    assert _cached_tokens(engine, "none1", None) == 0  # unsalted does not see salted blocks
    assert _cached_tokens(engine, "a2", "tenant-a") == 32  # its own tenant's two full blocks
    assert _cached_tokens(engine, "none2", "") == 32  # "" is no salt: it hits the unsalted request's blocks


def test_decode_reservation_and_prefill_hash_with_the_salt(engine):
    """The disaggregated roles on one pool: a prefill of tenant a caches blocks that a's reservation
    (and its probe) finds and b's does not."""
    held = add_prefill_request(engine, "p", list(PROMPT), _params("tenant-a"))
    while engine.has_unfinished_requests():
        engine.step()
    release_blocks(engine, held)
    assert count_uncached_tokens(engine, PROMPT, "tenant-a") == 8
    assert count_uncached_tokens(engine, PROMPT, "tenant-b") == count_uncached_tokens(engine, PROMPT) == 40
    for rid, salt, cached in (("ra", "tenant-a", 2), ("rb", "tenant-b", 0), ("rn", None, 0)):
        assert reserve_remote_kv(engine, rid, list(PROMPT), _params(salt)).num_cached_blocks == cached, rid
        fail_remote_kv(engine, rid)


def test_no_salt_keeps_the_hashes_of_before():
    tokens = list(range(48))
    before, parent = [], None  # the chain as it was hashed before salts: from b"root"
    for b in range(3):
        parent = hash_block_tokens(parent, tokens[16 * b : 16 * (b + 1)])
        before.append(parent)
    assert hash_token_blocks(tokens, 16) == hash_token_blocks(tokens, 16, cache_salt="") == before
    salted = hash_token_blocks(tokens, 16, cache_salt="s")
    assert all(s != h for s, h in zip(salted, before)) and salted == hash_token_blocks(tokens, 16, cache_salt="s")
    assert salted != hash_token_blocks(tokens, 16, cache_salt="t")


def test_a_salt_that_is_no_bounded_string_is_refused():
    for bad in (5, b"bytes", "x" * 257):
        with pytest.raises(ValueError, match="cache_salt"):
            SamplingParams(cache_salt=bad)
    assert SamplingParams(cache_salt="x" * 256).cache_salt == "x" * 256
