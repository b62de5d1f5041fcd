"""Prefill and decode workers hosted in this process (loop and I/O threads), real sockets, real engines,
through the handoff (no Ray)."""

from __future__ import annotations

import contextlib
import json
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from transformers import AutoTokenizer

import decode_worker.worker
from decode_worker.actor import decode_worker_maker
from decode_worker.worker import DecodeWorkerConfig
from engine import LLM, EngineArgs, SamplingParams
from engine.llm_engine import LLMEngine
from router.handoff import HandoffError, HandoffTimeouts
from wire.push_pull import Pushers, TokenStream
from wire.requests import FirstToken, PrefillFailed
from wire.socket_security import refusals
from prefill_worker.actor import prefill_worker_maker
from prefill_worker.worker import PrefillWorkerConfig
from runtime.hosting import HostedWorker
from runtime.step_trace import read_step_trace
from tests.conftest import hf_greedy
from tests.e2e.harness import GREEDY, PROMPTS, Driver, abort_request, request, run_requests, start_request, wait_for


def _args(model_dir: str, **kwargs) -> EngineArgs:
    # float32 unless asked: what the transformers reference computes in (auto may pick bf16 here)
    return EngineArgs(model=model_dir, max_model_len=256, **{"num_kv_blocks": 48, "dtype": "float32", **kwargs})


@contextlib.contextmanager
def _workers(model_dir: str, decode_config=DecodeWorkerConfig(), decode_args=None, prefill_args=None,
             prefill_config=PrefillWorkerConfig()):  # fmt: skip
    """A prefill and a decode worker hosted here; checks both pools are all free before stopping them."""
    prefill = HostedWorker("prefill", prefill_worker_maker(prefill_args or _args(model_dir), prefill_config))
    decode = HostedWorker("decode", decode_worker_maker(decode_args or _args(model_dir), decode_config))
    stream, driver = TokenStream(), Driver()
    try:
        yield driver.endpoint(decode), driver.endpoint(prefill), stream
        for hosted in (prefill, decode):
            wait_for(hosted.is_clean, f"{hosted.name} to go idle with every block free")
    finally:
        driver.close()
        prefill.stop()
        decode.stop()
        stream.close()


# Second case: prompts chunked on prefill, and 2 decode seats, so landed requests wait their turn.
@pytest.mark.parametrize("prefill_budget, decode_seats", [(2048, 256), (16, 2)], ids=["plain", "chunked_two_seats"])
def test_disaggregated_matches_transformers_and_reuses_prefixes(tiny_model_dirs, prefill_budget, decode_seats):
    model_dir = tiny_model_dirs["llama"]
    prefill_args = _args(model_dir, max_num_batched_tokens=prefill_budget)
    decode_args = _args(model_dir, max_num_seqs=decode_seats)
    with _workers(model_dir, decode_args=decode_args, prefill_args=prefill_args) as (decode, prefill, stream):
        results, reservations = run_requests(stream, PROMPTS, lambda i: (decode, prefill))
        # A second wave on the same prefixes: decode keeps its cached blocks and receives only the rest.
        again = {f"again-{rid}": prompt for rid, prompt in PROMPTS.items()}
        results2, reservations2 = run_requests(stream, again, lambda i: (decode, prefill))
        load = prefill.load()  # over its control socket, as the router polls it
    for rid, prompt in PROMPTS.items():
        expected = hf_greedy(model_dir, prompt, 8)
        assert results[rid].token_ids == expected, rid
        assert results2[f"again-{rid}"].token_ids == expected, rid
        assert results[rid].final.finish_reason == "length" and results[rid].final.num_prompt_tokens == len(prompt)
    assert not any(r.prefill_locally for r in reservations.values())
    assert reservations2["again-long"].num_cached_blocks == len(PROMPTS["long"]) // 16
    assert results2["again-long"].final.num_cached_tokens == 64
    assert load.prefix_cache_hit_rate > 0 and load.free_blocks == load.total_blocks == 48


def test_cache_salt_shares_blocks_only_within_a_salt_on_prefill_and_decode_alike(tiny_model_dirs):
    """vLLM's `cache_salt` through the handoff: decode's reservation and prefill's prefix cache hash the prompt
    with the same salt, so one tenant's second request hits on both and another tenant's hits on neither."""
    model_dir, prompt = tiny_model_dirs["llama"], PROMPTS["long"]  # 4 full blocks of 16 and a partial one
    with _workers(model_dir) as (decode, prefill, stream):
        waves, prefill_hit_rate = {}, {}
        for rid, salt in (("a1", "tenant-a"), ("b1", "tenant-b"), ("a2", "tenant-a")):
            params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, cache_salt=salt)
            waves[rid] = run_requests(stream, {rid: prompt}, lambda i: (decode, prefill), params)
            prefill_hit_rate[rid] = prefill.load().prefix_cache_hit_rate  # over its control socket
    expected = hf_greedy(model_dir, prompt, 8)
    for rid, (results, reservations) in waves.items():
        assert results[rid].token_ids == expected, rid
        assert not reservations[rid].prefill_locally
    cached = {rid: (res[rid].num_cached_blocks, results[rid].final.num_cached_tokens)
              for rid, (results, res) in waves.items()}  # fmt: skip
    assert cached == {"a1": (0, 0), "b1": (0, 0), "a2": (4, 64)}  # decode: only tenant a's second hits
    # Prefill's cache likewise: no hit at all until tenant a came back (its warm-up counts among the queries).
    assert prefill_hit_rate["a1"] == prefill_hit_rate["b1"] == 0.0 < prefill_hit_rate["a2"]


def test_bf16_blocks_cross_intact_disaggregated_equals_one_engine(tiny_model_dirs):
    """bfloat16 (auto's pick on CPUs that compute it natively): the KV blocks cross bit for bit, so the
    disaggregated path gives exactly what one bf16 engine gives (`tests/engine/test_parity_bf16.py`
    holds that engine to transformers' bf16)."""
    model_dir = tiny_model_dirs["llama"]
    bf16 = _args(model_dir, dtype="bfloat16")
    with _workers(model_dir, decode_args=bf16, prefill_args=bf16) as (decode, prefill, stream):
        results, reservations = run_requests(stream, PROMPTS, lambda i: (decode, prefill))
    assert not any(r.prefill_locally for r in reservations.values())
    one_engine = LLM(model_dir, num_kv_blocks=48, max_model_len=256, dtype="bfloat16")
    outs = one_engine.generate([{"prompt_token_ids": p} for p in PROMPTS.values()], GREEDY, use_tqdm=False)
    assert [results[rid].token_ids for rid in PROMPTS] == [o.outputs[0].token_ids for o in outs]


def test_colocated_mode_gives_the_same_tokens(tiny_model_dirs):
    model_dir = tiny_model_dirs["llama"]
    # Below 20 uncached tokens decode prefills itself; above, the prefill worker does.
    with _workers(model_dir, DecodeWorkerConfig(local_prefill_threshold=20)) as (decode, prefill, stream):
        results, reservations = run_requests(stream, PROMPTS, lambda i: (decode, prefill))
    assert {rid for rid, r in reservations.items() if r.prefill_locally} == {"tiny", "one-block"}
    for rid, prompt in PROMPTS.items():
        assert results[rid].token_ids == hf_greedy(model_dir, prompt, 8), rid


def test_aborts_reach_both_sides_and_free_everything(tiny_model_dirs):
    model_dir = tiny_model_dirs["llama"]
    long_run = SamplingParams(temperature=0, max_tokens=200, ignore_eos=True)
    with _workers(model_dir) as (decode, prefill, stream):
        # Waiting for KV that never comes (no prefill told): the client gives up.
        reply = decode.reserve(request("orphan", PROMPTS["long"], stream))
        assert not reply.prefill_locally
        abort_request("orphan", decode, prefill)
        # Decoding: cancelled after a few tokens.
        start_request(request("chatty", PROMPTS["mid"], stream, long_run), decode, prefill)
        wait_for(lambda: len(stream.requests.get("chatty", _Empty).tokens) >= 3, "tokens of chatty", stream=stream)
        abort_request("chatty", decode, prefill)
        wait_for(lambda: stream.finished("orphan") and stream.finished("chatty"), "final deltas", stream=stream)
    for rid in ("orphan", "chatty"):
        final = stream.requests[rid].final
        assert final.finish_reason == "abort" and "client" in final.error
    assert stream.requests["chatty"].final.num_output_tokens < 200


def test_a_reservations_transfer_token_reaches_its_prefill_and_no_stranger_acts_on_it(tiny_model_dirs, monkeypatch):
    # With a cluster key decode makes a random token per reservation; here, one known token stands in for it.
    monkeypatch.setattr(decode_worker.worker, "transfer_token", lambda: "the-reservations")
    model_dir = tiny_model_dirs["llama"]
    with _workers(model_dir) as (decode, prefill, stream):
        results, reservations = run_requests(stream, PROMPTS, lambda i: (decode, prefill))
        # Chunks and first tokens carried it, or decode would have taken none of them.
        assert all(r.transfer_token == "the-reservations" for r in reservations.values())
        reply = decode.reserve(request("waiting", PROMPTS["long"], stream))  # KV expected; no prefill told
        before, stranger = refusals(), Pushers()
        stranger.send(reply.inbox_address, FirstToken("waiting", 7, "a-guess"))
        stranger.send(reply.inbox_address, PrefillFailed("waiting", "forged"))
        reason = ("inbox", "wrong_transfer_token")
        wait_for(lambda: refusals().get(reason, 0) - before.get(reason, 0) == 2, "the stranger's messages refused",
                 stream=stream)
        assert decode.load().transferring == 1 and "waiting" not in stream.requests  # untouched, still waiting
        abort_request("waiting", decode, prefill)
        wait_for(lambda: stream.finished("waiting"), "the final delta", stream=stream)
        stranger.close()
    for rid, prompt in PROMPTS.items():
        assert results[rid].token_ids == hf_greedy(model_dir, prompt, 8), rid
    assert stream.requests["waiting"].final.finish_reason == "abort"


class _Empty:
    tokens: dict = {}


def test_full_decode_waits_then_fails_clearly_never_hangs(tiny_model_dirs):
    model_dir = tiny_model_dirs["llama"]
    with _workers(model_dir, decode_args=_args(model_dir, num_kv_blocks=5)) as (decode, prefill, stream):
        hog = decode.reserve(request("hog", PROMPTS["shared-b"], stream))  # 4 of 5 blocks
        assert len(hog.block_ids) == 4
        with pytest.raises(HandoffError, match="no decode room"):
            start_request(request("late", PROMPTS["mid"], stream), decode, prefill, HandoffTimeouts(reserve_wait_s=0.2))
        with pytest.raises(HandoffError, match="decode refused"):
            start_request(request("huge", list(range(3, 99)), stream), decode, prefill)  # over 5 blocks' context
        abort_request("hog", decode, prefill)
        wait_for(lambda: stream.finished("hog"), "hog's final delta", stream=stream)
        # Room again: the same request now runs.
        results, _ = run_requests(stream, {"late": PROMPTS["mid"]}, lambda i: (decode, prefill))
    assert results["late"].token_ids == hf_greedy(model_dir, PROMPTS["mid"], 8)


@pytest.mark.parametrize("policy", ["fail", "recompute"])
def test_transfer_that_cannot_start_follows_the_kv_transfer_failure_policy(tiny_model_dirs, policy):
    model_dir = tiny_model_dirs["llama"]
    # Decode caches 8-token blocks, prefill 16: the receiver refuses the sender's handshake.
    decode_args = _args(model_dir, block_size=8, num_kv_blocks=96)
    config = DecodeWorkerConfig(kv_transfer_failure=policy)
    with _workers(model_dir, config, decode_args=decode_args) as (decode, prefill, stream):
        start_request(request("mismatch", PROMPTS["mid"], stream), decode, prefill)
        wait_for(lambda: stream.finished("mismatch"), "the request to end", stream=stream)
    result = stream.requests["mismatch"]
    if policy == "fail":
        assert result.final.finish_reason == "abort" and "block_size" in result.final.error
    else:  # decode prefilled the prompt itself
        assert result.token_ids == hf_greedy(model_dir, PROMPTS["mid"], 8)
        assert (result.final.finish_reason, result.final.num_output_tokens) == ("length", 8)


@pytest.mark.parametrize("hold_s, steps", [(0.5, 8), (0.0, None)], ids=["held", "not_held"])
def test_a_burst_of_local_prompts_is_prefilled_in_one_step_when_the_window_holds(tiny_model_dirs, hold_s, steps):
    """Colocated (every prompt prefilled on decode): prompts reaching an idle engine within the arrival
    window share its first step, so 8 tokens each take 8 steps; with no window the first one goes alone."""
    from runtime.arrival_window import ArrivalWindowConfig

    model_dir = tiny_model_dirs["llama"]
    config = DecodeWorkerConfig(local_prefill_threshold=1 << 20,
                                arrival_window=ArrivalWindowConfig(quiet_s=hold_s, max_hold_s=2 * hold_s))  # fmt: skip
    prompts = {rid: PROMPTS[rid] for rid in ("tiny", "one-block", "mid", "long")}
    with _workers(model_dir, decode_config=config) as (decode, prefill, stream):
        results, reservations = run_requests(stream, prompts, lambda i: (decode, None))
        # The last token streams out inside its step, before the step is counted: read the count once the
        # loop has published the round that ended it (nothing running).
        wait_for(lambda: decode.load().running == 0, "the last step to be counted", stream=stream)
        taken = decode.load().steps
    assert all(r.prefill_locally for r in reservations.values())
    assert all(results[rid].token_ids == hf_greedy(model_dir, prompt, 8) for rid, prompt in prompts.items())
    if steps is not None:
        assert taken == steps
    else:
        assert taken > 8


def _object_schema(properties: int) -> str:
    """One object of optional properties, two types each: xgrammar's compile time grows steeply with their
    number (tiny model's vocabulary, here: 300 in 0.09 s, 600 in 1.0 s, 900 in 7.9 s)."""
    each = {"type": ["string", "integer"]}
    return json.dumps({"type": "object", "properties": {f"p{i}": each for i in range(properties)}})


SLOW_SCHEMA = _object_schema(600)  # slower to compile (twice: runtime.grammar_child) than a plain request runs
HUGE_SCHEMA = _object_schema(900)  # far past a compile timeout of 0.2 s


def test_a_slow_grammar_compiles_off_the_loops_while_other_requests_stream(tiny_model_dirs, monkeypatch):
    """Both workers compile a grammar on a thread of their own: requests reserved after it are served meanwhile,
    on one torch thread fewer (`runtime.step_threads`: the compile has a core), the request waits (not in any
    step) and then runs under its grammar; cached, it is taken at once; an invalid one is refused as the
    request's fault, as when it was compiled inline."""
    model_dir = tiny_model_dirs["llama"]
    structured = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, structured=("json", SLOW_SCHEMA))
    decode_steps = []  # (the requests the decode engine holds, torch's threads on its loop thread) at each step
    real_step = LLMEngine.step

    def step(engine):
        if engine.kv_connector is None:  # decode's engine (prefill's carries its KV sender)
            decode_steps.append((set(engine.requests), torch.get_num_threads()))
        return real_step(engine)

    monkeypatch.setattr(LLMEngine, "step", step)
    with _workers(model_dir) as (decode, prefill, stream), ThreadPoolExecutor(1) as client:
        slow = client.submit(start_request, request("slow", PROMPTS["mid"], stream, structured), decode, prefill)
        wait_for(lambda: decode.load().waiting == 1, "decode to hold the request while its grammar compiles")
        results, _ = run_requests(stream, {"plain": PROMPTS["long"]}, lambda i: (decode, prefill))
        assert not slow.done()  # still compiling (before: the loop compiled it, and "plain" waited behind it)
        slow.result(120)
        wait_for(lambda: stream.finished("slow"), "the slow request's tokens", stream=stream)
        again, _ = run_requests(stream, {"again": PROMPTS["mid"]}, lambda i: (decode, prefill), structured)
        with pytest.raises(HandoffError, match="decode refused request bad: invalid regex for structured output"):
            start_request(request("bad", PROMPTS["mid"], stream, SamplingParams(structured=("regex", "a(b"))),
                          decode, prefill)  # fmt: skip
    assert results["plain"].token_ids == hf_greedy(model_dir, PROMPTS["long"], 8)
    text = AutoTokenizer.from_pretrained(model_dir).decode(stream.requests["slow"].token_ids)
    assert text.startswith("{")  # under the schema (the random model's greedy text is no JSON)
    assert again["again"].token_ids == stream.requests["slow"].token_ids
    (full,) = {threads for held, threads in decode_steps if "again" in held}  # no compile then: every thread
    assert [threads for held, threads in decode_steps if "plain" in held][0] == max(1, full - 1)  # "slow" compiles


def test_a_grammar_past_the_compile_timeout_is_refused_and_the_worker_compiles_the_next(tiny_model_dirs):
    model_dir = tiny_model_dirs["llama"]
    slow = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, structured=("json", HUGE_SCHEMA))
    choice = SamplingParams(temperature=0, max_tokens=8, structured=("choice", '["yes", "no"]'))
    with _workers(model_dir, DecodeWorkerConfig(grammar_compile_timeout_s=0.2)) as (decode, prefill, stream):
        with pytest.raises(HandoffError, match="did not compile within 0.2 s"):
            start_request(request("slow", PROMPTS["mid"], stream, slow), decode, prefill)
        results, _ = run_requests(stream, {"choice": PROMPTS["mid"]}, lambda i: (decode, prefill), choice)
    text = AutoTokenizer.from_pretrained(model_dir).decode(results["choice"].token_ids, skip_special_tokens=True)
    assert text in ("yes", "no")


def test_past_the_compile_queue_bound_a_new_grammar_is_refused_as_busy_at_once_on_either_worker(tiny_model_dirs):
    """One grammar compiling fills a queue of 1: on decode, the next new grammar's reserve is refused as busy
    (the router's 503, no retrying for 30 s); on prefill, its task is refused so and the decode reservation
    freed. Requests without a grammar go on meanwhile; once the compile ended the next grammar is taken."""
    model_dir = tiny_model_dirs["llama"]
    quick = SamplingParams(temperature=0, max_tokens=8, structured=("choice", '["yes", "no", "maybe"]'))
    for bounded in ("decode", "prefill"):
        configs = {f"{bounded}_config": (DecodeWorkerConfig if bounded == "decode" else PrefillWorkerConfig)(
            max_grammar_compiles_waiting=1)}  # fmt: skip
        slow = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True, structured=("json", SLOW_SCHEMA))
        with _workers(model_dir, **configs) as (decode, prefill, stream), ThreadPoolExecutor(1) as client:
            busy_worker = decode if bounded == "decode" else prefill
            first = client.submit(start_request, request("slow", PROMPTS["mid"], stream, slow), decode, prefill)
            wait_for(lambda: busy_worker.load().waiting == 1, f"{bounded} to compile the first grammar")
            with pytest.raises(HandoffError, match="grammars are compiling or waiting") as refused:
                start_request(request("busy", PROMPTS["mid"], stream, quick), decode, prefill)
            assert refused.value.retryable  # the client's 503 with Retry-After
            plain, _ = run_requests(stream, {"plain": PROMPTS["long"]}, lambda i: (decode, prefill))
            first.result(120)
            wait_for(lambda: stream.finished("slow"), "the first grammar's request", stream=stream)
            later, _ = run_requests(stream, {"later": PROMPTS["mid"]}, lambda i: (decode, prefill), quick)
        assert plain["plain"].token_ids == hf_greedy(model_dir, PROMPTS["long"], 8)
        text = AutoTokenizer.from_pretrained(model_dir).decode(later["later"].token_ids, skip_special_tokens=True)
        assert text in ("yes", "no", "maybe")


def test_step_trace_writes_each_served_step_with_its_shape(tiny_model_dirs, tmp_path, monkeypatch):
    """TANDEM_STEP_TRACE: each worker appends a line per engine step (its shape and seconds), as its loop ran it."""
    monkeypatch.setenv("TANDEM_STEP_TRACE", str(tmp_path))
    with _workers(tiny_model_dirs["llama"]) as (decode, prefill, stream):
        run_requests(stream, PROMPTS, lambda i: (decode, prefill))
    traces = {path.name.split("-")[0]: read_step_trace(path) for path in tmp_path.glob("*.jsonl")}
    assert sorted(traces) == ["decode", "prefill"]
    prefill_steps, decode_steps = traces["prefill"], traces["decode"]
    # Prefill computes every prompt and samples its first token (shared-b's first 2 blocks come from the cache
    # when shared-a was computed in an earlier step, not beside it).
    total = sum(map(len, PROMPTS.values()))
    assert sum(s["sampled_rows"] for s in prefill_steps) == len(PROMPTS)
    assert sum(s["tokens"] for s in prefill_steps) in (total - 32, total)
    # Each line keeps its prefill chunks, whose counts its shape sums up.
    for s in prefill_steps:
        assert sum(new for new, _ in s["chunks"]) == s["prompt_tokens"] == s["tokens"]
        assert sum(new + context for new, context in s["chunks"]) == s["prefill_context_tokens"]
    assert all(s["chunks"] == [] for s in decode_steps)
    # Decode runs tokens 2..8 of each request, one row a step each, after the context it received.
    assert all(s["tokens"] == s["sequences"] == s["sampled_rows"] and s["decode_context_tokens"] > 0
               for s in decode_steps)  # fmt: skip
    assert sum(s["tokens"] for s in decode_steps) == len(PROMPTS) * (GREEDY.max_tokens - 1)
    for steps in (prefill_steps, decode_steps):
        assert all(s["s"] > 0 for s in steps) and [s["t"] for s in steps] == sorted(s["t"] for s in steps)
