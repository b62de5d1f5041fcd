"""Scheduler logic with no model: budgets, chunking, prefix hits, preemption, frees."""

from engine.config import SchedulerConfig
from engine.kv_cache_manager import KVCacheManager
from engine.request import Request, RequestStatus
from engine.sampling_params import SamplingParams
from engine.scheduler import Scheduler


def _req(rid: str, prompt_len: int, max_tokens: int = 8, start: int = 0) -> Request:
    return Request(rid, list(range(start, start + prompt_len)), SamplingParams(max_tokens=max_tokens), max_tokens)


def _scheduler(num_blocks=64, block_size=4, max_num_seqs=8, budget=16, caching=True):
    kv = KVCacheManager(num_blocks, block_size, enable_prefix_caching=caching)
    return Scheduler(SchedulerConfig(max_num_seqs, budget, 1024), kv)


def _run_step(sched: Scheduler, token: int = 1):
    """Apply a step's effects as the engine would, with a fake sampled token."""
    out = sched.schedule()
    for s in out.scheduled:
        samples = s.samples
        s.request.num_computed_tokens += s.num_new_tokens
        sched.kv_cache.cache_computed_blocks(s.request)
        if samples:
            s.request.output_token_ids.append(token)
    return out


def test_chunked_prefill_fills_what_decode_leaves():
    sched = _scheduler(budget=10)
    a, b = _req("a", 6), _req("b", 20, start=100)
    sched.add_request(a)
    out = _run_step(sched)
    assert [(s.request.request_id, s.num_new_tokens) for s in out.scheduled] == [("a", 6)]
    sched.add_request(b)
    out = _run_step(sched)
    # a decodes one token; b gets the remaining 9 tokens of budget as its first chunk.
    assert [(s.request.request_id, s.num_new_tokens) for s in out.scheduled] == [("a", 1), ("b", 9)]
    assert out.scheduled[0].is_decode and not out.scheduled[1].samples
    out = _run_step(sched)
    assert [(s.request.request_id, s.num_new_tokens) for s in out.scheduled] == [("a", 1), ("b", 9)]
    out = _run_step(sched)
    assert [(s.request.request_id, s.num_new_tokens) for s in out.scheduled] == [("a", 1), ("b", 2)]
    assert out.scheduled[1].samples and len(b.output_token_ids) == 1


def test_max_num_seqs_limits_running():
    sched = _scheduler(max_num_seqs=2, budget=100)
    for i in range(3):
        sched.add_request(_req(str(i), 3))
    out = sched.schedule()
    assert len(out.scheduled) == 2 and len(sched.waiting) == 1


def test_prefix_hit_skips_computed_blocks_but_leaves_one_token():
    sched = _scheduler(block_size=4, budget=100)
    a = _req("a", 9)
    sched.add_request(a)
    _run_step(sched)
    sched.finish(a, RequestStatus.FINISHED_STOPPED)
    b = _req("b", 12)  # shares a's first 9 tokens: two full blocks cached
    sched.add_request(b)
    out = _run_step(sched)
    assert b.num_cached_tokens == 8
    assert out.scheduled[0].num_new_tokens == 4
    c = _req("c", 8)  # fully cached prompt: the last block is recomputed to get logits
    sched.add_request(c)
    out = _run_step(sched)
    assert c.num_cached_tokens == 4 and [s.num_new_tokens for s in out.scheduled if s.request is c] == [4]
    # Prompt tokens queried: 9 + 12 + 8; served from the cache: 0 + 8 + 4.
    assert sched.kv_cache.pool.hit_rate == 12 / 29
    assert 0.0 < sched.kv_cache.usage < 1.0


def test_preempts_newest_when_blocks_run_out_and_frees_on_finish():
    sched = _scheduler(num_blocks=4, block_size=4, budget=100, caching=False)
    a, b = _req("a", 7, start=0), _req("b", 7, start=100)
    sched.add_request(a)
    sched.add_request(b)
    _run_step(sched)  # both hold 2 blocks; the pool is now full
    assert sched.kv_cache.num_free_blocks == 0
    _run_step(sched)  # a's 8th token fits its block; b's too
    out = _run_step(sched)  # both need a third block: b (newest) is preempted
    assert out.preempted == [b] and b.status == RequestStatus.PREEMPTED and b.num_computed_tokens == 0
    assert sched.waiting[0] is b and sched.num_preemptions == 1
    sched.finish(a, RequestStatus.FINISHED_LENGTH)
    out = _run_step(sched)
    # b is recomputed from prompt plus its generated tokens.
    assert out.scheduled[0].request is b and out.scheduled[0].num_new_tokens == 7 + 2
    sched.finish(b, RequestStatus.FINISHED_ABORTED)
    assert sched.kv_cache.num_free_blocks == 4 and not sched.has_unfinished()


def test_a_new_suspect_runs_alone_once_a_seat_is_free():
    """A request the router marks suspect (an earlier attempt failed a step alone) steps alone, never beside
    the running ones, and waits for a seat like any new request; once a step of its own samples, it batches."""
    sched = _scheduler(max_num_seqs=2, budget=100)
    a, b = _req("a", 3, max_tokens=2), _req("b", 3, start=10)
    sched.add_request(a)
    sched.add_request(b)
    _run_step(sched)
    resumed = _req("resumed", 3, start=20)
    resumed.suspect = True
    sched.add_request(resumed)
    out = _run_step(sched)  # both seats held: the others step, the suspect waits
    assert [s.request.request_id for s in out.scheduled] == ["a", "b"] and resumed in sched.waiting
    sched.finish(a, RequestStatus.FINISHED_LENGTH)
    out = _run_step(sched)  # a seat: the suspect alone (b waits a step)
    assert [s.request.request_id for s in out.scheduled] == ["resumed"]
    resumed.suspect = False  # what the engine does once its lone step sampled (`LLMEngine._update`)
    out = _run_step(sched)
    assert sorted(s.request.request_id for s in out.scheduled) == ["b", "resumed"]
