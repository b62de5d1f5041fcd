"""The router's routing keys honour a request's `cache_salt` (wire.cache_salt): a salted prompt is sent where
its own salt's prefix went, never where only another tenant's (or an unsalted) copy of it is cached; the
request body's field is checked (a 400 naming it) and travels to the workers in the SamplingSpec."""

from __future__ import annotations

import asyncio
import contextlib

import pytest
from pydantic import ValidationError

from router.api_models import ChatCompletionRequest, CompletionRequest
from router.block_keys import ROOT_KEY, block_keys, root_key
from router.dispatch import Dispatcher
from router.openai_common import sampling_from
from router.policy import make_policy
from router.registry import WorkerRegistry
from router.token_stream import TokenStreamConsumer
from router.worker_state import WorkerState
from tests.e2e.harness import PROMPTS
from tests.router.test_local_prefill import FakeDecode, FakePrefill
from wire.codec import decode, encode
from wire.requests import SamplingSpec
from wire.sampling_rules import SamplingOutOfRange

SYSTEM = list(range(1000, 1256))  # 16 blocks of 16


def test_salted_keys_differ_from_the_first_block_on_and_no_salt_keeps_the_old_keys():
    tokens = SYSTEM + [7] * 20
    plain = block_keys(tokens, 16)
    assert block_keys(tokens, 16, None) == block_keys(tokens, 16, "") == plain and root_key("") == ROOT_KEY
    salted = block_keys(tokens, 16, "tenant-a")
    assert len(salted) == len(plain) and all(s != p for s, p in zip(salted, plain))
    assert salted == block_keys(tokens, 16, "tenant-a") != block_keys(tokens, 16, "tenant-b")


def test_cache_aware_follows_a_prefix_only_under_the_same_salt():
    policy = make_policy("cache_aware")
    workers = [WorkerState(f"p{i}", "prefill") for i in range(3)]
    home_a = policy.pick(SYSTEM + [1], workers, cache_salt="tenant-a")
    home_b = policy.pick(SYSTEM + [1], workers, cache_salt="tenant-b")  # the same prompt, nothing to follow
    home_plain = policy.pick(SYSTEM + [1], workers)
    assert len({home_a.name, home_b.name, home_plain.name}) == 3 and policy.decisions["spread"] == 3
    for turn in range(2, 5):
        assert policy.pick(SYSTEM + [turn], workers, cache_salt="tenant-a") is home_a
        assert policy.pick(SYSTEM + [turn], workers, cache_salt="tenant-b") is home_b
        assert policy.pick(SYSTEM + [turn], workers) is home_plain
    assert policy.decisions["cache"] == 9


@contextlib.asynccontextmanager
async def _dispatching(decode, prefills):
    """A dispatcher routing prefill by `cache_aware` over the fake `prefills`, decode on `decode`."""
    registry = WorkerRegistry(make_policy("cache_aware"))
    registry.register("decode-0", "decode", decode)
    for i, prefill in enumerate(prefills):
        registry.register(f"prefill-{i}", "prefill", prefill)
    stream = TokenStreamConsumer()
    await stream.start()
    try:
        yield Dispatcher(registry, stream)
    finally:
        await stream.close()


def test_dispatch_routes_by_the_requests_salt_and_sends_it_to_both_workers():
    decode_worker, prefills = FakeDecode(), [FakePrefill(), FakePrefill()]
    prompt = PROMPTS["long"]  # 4 full blocks

    async def main():
        async with _dispatching(decode_worker, prefills) as dispatcher:
            for salt in ("tenant-a", "tenant-b", "tenant-a", "tenant-b"):
                gen = await dispatcher.start(prompt, SamplingSpec(temperature=0.0, max_tokens=4, cache_salt=salt))
                gen.close()
            await dispatcher.drain_aborts()

    asyncio.run(main())
    salts = [[t.request.sampling.cache_salt for t in p.tasks] for p in prefills]
    # Each tenant's second request follows its first; the two tenants never meet on one worker's prefix.
    assert sorted(salts) == [["tenant-a", "tenant-a"], ["tenant-b", "tenant-b"]]
    assert [r.sampling.cache_salt for r in decode_worker.reserved] == ["tenant-a", "tenant-b"] * 2
    wire_form = decode(encode(decode_worker.reserved[0]), type(decode_worker.reserved[0]))
    assert wire_form.sampling.cache_salt == "tenant-a"  # the msgpack form carries it


@pytest.mark.parametrize("body", [CompletionRequest, ChatCompletionRequest])
def test_the_body_field_is_a_bounded_string_or_a_400_naming_it(body):
    fields = {"prompt": "hi"} if body is CompletionRequest else {"messages": [{"role": "user", "content": "hi"}]}
    spec = sampling_from(body(model="m", cache_salt="tenant-a", **fields), 100, max_tokens=8, logprobs=None)
    assert spec.cache_salt == "tenant-a"
    assert sampling_from(body(model="m", **fields), 100, 8, None).cache_salt is None
    for bad in (5, "x" * 257, ["a"], ""):
        with pytest.raises(ValidationError) as refused:
            body(model="m", cache_salt=bad, **fields)
        assert refused.value.errors()[0]["loc"] == ("cache_salt",)
    with pytest.raises(SamplingOutOfRange, match="cache_salt"):  # the wire's own rule, behind pydantic's
        SamplingSpec(cache_salt="x" * 257)
