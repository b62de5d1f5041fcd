"""The simulator runs the engine's own scheduler on priced time: small cases reckoned by hand, exactly."""

from __future__ import annotations

import dataclasses

import pytest

from costmodel import TransferCost
from planner.layout import EngineLimits, Layout, PoolLayout
from planner.sim.run import simulate
from planner.workload import SimRequest, WorkloadSpec
from runtime.arrival_window import ArrivalWindowConfig
from tests.planner.profiles import TINY_DIMS, hand_profile

NO_WINDOW = ArrivalWindowConfig(max_hold_s=0.0)
LIMITS = EngineLimits(max_num_batched_tokens=64)


def prompt(n: int, first: int = 100) -> tuple[int, ...]:
    return tuple(range(first, first + n))


def test_colocated_schedule_as_reckoned_by_hand():
    """One worker, a 64-token budget, steps of 10 ms + 1 ms per token.

    0.000 A (100 tokens) arrives: a 64-token chunk of A               74 ms -> 0.074
    0.050 B (10 tokens) arrives; the worker is inside a step
    0.074 A's last 36 tokens + B's 10: both sample their first token  56 ms -> 0.130
    0.130 two decode rows                                             12 ms -> 0.142  (B's 2nd and last token)
    0.142 one decode row                                              11 ms -> 0.153  (A's 3rd and last token)
    """
    layout = Layout(PoolLayout(0, None), PoolLayout(1, hand_profile()), LIMITS, arrival_window=NO_WINDOW)
    result = simulate(layout, [SimRequest(0.0, prompt(100), 3), SimRequest(0.05, prompt(10, 900), 2)])
    a, b = result.requests
    assert a.token_times == pytest.approx([0.130, 0.142, 0.153])
    assert b.token_times == pytest.approx([0.130, 0.142])
    assert (a.ttft, b.ttft, b.latency) == pytest.approx((0.130, 0.080, 0.092))
    assert result.duration_s == pytest.approx(0.153) and result.steps == 4


def test_each_streamed_token_adds_its_time_to_the_step_that_samples_it():
    """The first case with 2 ms a streamed token: A's first chunk samples nothing (74 ms), the next step samples
    A's and B's first tokens (56 + 4 ms), then two rows (12 + 4 ms), then one (11 + 2 ms)."""
    profile = hand_profile()
    profile = dataclasses.replace(profile, serving=dataclasses.replace(profile.serving, per_served_row_s=0.002))
    layout = Layout(PoolLayout(0, None), PoolLayout(1, profile), LIMITS, arrival_window=NO_WINDOW)
    result = simulate(layout, [SimRequest(0.0, prompt(100), 3), SimRequest(0.05, prompt(10, 900), 2)])
    a, b = result.requests
    assert a.token_times == pytest.approx([0.134, 0.150, 0.163])
    assert b.token_times == pytest.approx([0.134, 0.150])


def test_disaggregated_schedule_with_handoff_and_transfer():
    """1 prefill + 1 decode worker, 1 ms per hop; the KV (32 B a token) moves at 32 MB/s after a 2 ms latency.

    0.000 arrival -> 0.001 reserve on decode -> 0.002 reply -> 0.003 prefill task
    0.003 prefill: 64 tokens 74 ms -> 0.077; 36 tokens 46 ms -> 0.123 (first token)
    0.124 the first token reaches the client and decode's inbox
          the KV: 100 tokens = 0.1 ms on the wire, streamed from 0.077; the last of 2 layers leaves after
          the step: lands at max(0.0771, 0.12305) + 0.002 = 0.12505
    0.12505 decode admits it and steps one row: 11 ms -> 0.13605 (+1 ms: 0.13705); again -> 0.14805
    """
    transfer = TransferCost(latency_s=0.002, bytes_per_s=32e6)
    profile = hand_profile(message_s=0.001, transfer=transfer)
    layout = Layout(PoolLayout(1, profile), PoolLayout(1, profile), LIMITS, arrival_window=NO_WINDOW)
    result = simulate(layout, [SimRequest(0.0, prompt(100), 3)])
    (a,) = result.requests
    assert a.token_times == pytest.approx([0.124, 0.13705, 0.14805])
    assert a.success and a.output_tokens == 3


def test_a_prefill_workers_steps_take_the_time_its_kv_takes_to_stream_out():
    """The disaggregated case with the prefill worker's sends priced at 5 ms + 0.1 ms a prompt token: its two
    chunks (64 and 36 tokens) take 11.4 and 8.6 ms longer, the first token and all after it 20 ms later; the
    decode worker's steps, which send nothing, are priced as before."""
    transfer = TransferCost(latency_s=0.002, bytes_per_s=32e6)
    profile = hand_profile(message_s=0.001, transfer=transfer)
    sending = dataclasses.replace(profile, serving=dataclasses.replace(profile.serving, kv_send_s=0.005,
                                                                       kv_send_per_token_s=0.0001))  # fmt: skip
    layout = Layout(PoolLayout(1, sending), PoolLayout(1, sending), LIMITS, arrival_window=NO_WINDOW)
    (a,) = simulate(layout, [SimRequest(0.0, prompt(100), 3)]).requests
    assert a.token_times == pytest.approx([0.144, 0.15705, 0.16805])


def test_the_arrival_window_holds_an_idle_workers_first_step():
    """Arrivals 0 and 5 ms apart reach an idle worker: its first step waits for quiet (12 ms) and takes both."""
    layout = Layout(PoolLayout(0, None), PoolLayout(1, hand_profile()), LIMITS)
    result = simulate(layout, [SimRequest(0.0, prompt(20), 1), SimRequest(0.005, prompt(20, 500), 1)])
    # The window closes 12 ms after the last arrival: one step of 40 tokens, 50 ms.
    assert [r.token_times for r in result.requests] == [pytest.approx([0.067])] * 2


def test_blocks_come_back_and_a_full_decode_pool_preempts_and_still_finishes():
    """A decode KV pool too small for every request at once: the engine preempts and recomputes; all finish."""
    limits = EngineLimits(max_num_batched_tokens=256, num_kv_blocks=24)  # 384 tokens of KV
    layout = Layout(PoolLayout(0, None), PoolLayout(1, hand_profile()), limits)
    requests = WorkloadSpec(num_prompts=8, random_input_len=100, random_output_len=60, ignore_eos=True).requests(1000)
    result = simulate(layout, requests)
    assert all(r.success and r.output_tokens == 60 for r in result.requests)


def test_disaggregated_pools_free_every_block():
    profile = hand_profile(message_s=0.001, transfer=TransferCost(0.001, 1e6))
    layout = Layout(PoolLayout(2, profile), PoolLayout(2, profile), EngineLimits())
    requests = WorkloadSpec(num_prompts=40, random_input_len=120, random_output_len=20, request_rate=50,
                            ignore_eos=True).requests(TINY_DIMS.vocab_size)  # fmt: skip
    from planner.sim.events import EventQueue
    from planner.sim.router import SimRouter
    from planner.sim.run import _Client, build_workers

    events = EventQueue()
    workers = build_workers(layout, events)
    router = SimRouter(events, workers, layout.router, 16, colocated=False)
    router.start_polling()
    client = _Client(events, router, requests, None)
    events.run()
    assert client.ended == 40 and all(r.success for r in client.requests)
    events.run(until=events.now + 1.0)  # let the last TransferDone arrive
    for w in workers:
        assert w.engine.kv_cache.num_free_blocks == w.engine.kv_cache.pool.num_blocks, w.name
    assert all(s.in_flight == 0 and s.prompt_tokens_queued == 0 for s in router.registry.workers.values())


def test_a_step_is_slower_while_the_hosts_other_workers_have_work():
    """Two colocated workers; steps of 10 ms + 1 ms per token, served at 1x alone and 2x beside a busy one.

    One request alone: prefill 10 tokens 20 ms, decode rows 11 ms each:   0.020, 0.031, 0.042
    Two at once, one on each worker (a factor is read as a step starts):
      A's prefill starts before B reaches the other worker: alone, 20 ms;  0.020
      then A decodes while B is busy, 22 ms each:                          0.042, 0.064
      B's prefill, decodes, all beside A busy (A's last step ends 0.064):  0.040, 0.062, 0.084
    """
    base = hand_profile()
    profile = dataclasses.replace(base, serving=dataclasses.replace(base.serving, step_factor=2.0,
                                                                    alone_step_factor=1.0))  # fmt: skip
    layout = Layout(PoolLayout(0, None), PoolLayout(2, profile), LIMITS, arrival_window=NO_WINDOW)
    (alone,) = simulate(layout, [SimRequest(0.0, prompt(10), 3)]).requests
    assert alone.token_times == pytest.approx([0.020, 0.031, 0.042])
    pair = simulate(layout, [SimRequest(0.0, prompt(10), 3), SimRequest(0.0, prompt(10, 900), 3)]).requests
    a, b = pair
    assert a.token_times == pytest.approx([0.020, 0.042, 0.064])
    assert b.token_times == pytest.approx([0.040, 0.062, 0.084])
    # A worker with no other on its host contends with none: served as alone.
    single = Layout(PoolLayout(0, None), PoolLayout(1, profile), LIMITS, arrival_window=NO_WINDOW)
    (lone,) = simulate(single, [SimRequest(0.0, prompt(10), 3)]).requests
    assert lone.token_times == pytest.approx([0.020, 0.031, 0.042])


def test_decode_rows_are_slowed_by_neighbours_that_decode_not_by_a_busy_prefill_worker():
    """A stream decodes while a second prompt of 60 tokens is prefilled beside it, on the same host: beside a
    prefill worker (1P+1D) its steps are served as alone; beside a colocated worker, at the busy factor."""
    base = hand_profile()
    contended = dataclasses.replace(base, serving=dataclasses.replace(base.serving, step_factor=2.0,
                                                                      alone_step_factor=1.0))  # fmt: skip
    requests = [SimRequest(0.0, prompt(10), 12), SimRequest(0.05, prompt(60, 900), 1)]  # the second: no decode row

    def first_stream(profile, prefill_workers: int) -> list[float]:
        layout = Layout(PoolLayout(prefill_workers, profile if prefill_workers else None),
                        PoolLayout(2 - prefill_workers, profile), LIMITS, arrival_window=NO_WINDOW)  # fmt: skip
        return simulate(layout, requests).requests[0].itl

    assert first_stream(contended, 1) == pytest.approx(first_stream(base, 1))
    assert sum(first_stream(contended, 0)) > sum(first_stream(base, 0)) * 1.3
    # Where a decode step beside a prefilling worker was measured slower, the stream beside it is too.
    beside_prefill = dataclasses.replace(contended, serving=dataclasses.replace(contended.serving,
                                                                                beside_prefill_factor=2.0))  # fmt: skip
    assert sum(first_stream(beside_prefill, 1)) > sum(first_stream(base, 1)) * 1.3


def test_colocated_workers_are_chosen_by_prefix_so_a_shared_prompt_is_computed_once():
    """Two colocated workers, prefixes P and Q of 64 tokens (4 blocks). P goes to one worker, Q (while P is
    in flight) to the other; later, Q's and then P's second prompts each go where their prefix is cached:
    only the 8 new tokens are computed (18 ms), not 72 (two steps: 74 + 18 ms)."""
    p, q = prompt(64, 100), prompt(64, 500)
    layout = Layout(PoolLayout(0, None), PoolLayout(2, hand_profile()), LIMITS, arrival_window=NO_WINDOW)
    requests = [SimRequest(0.0, p + prompt(8, 900), 2), SimRequest(0.001, q + prompt(8, 910), 2),
                SimRequest(1.0, q + prompt(8, 920), 2), SimRequest(2.0, p + prompt(8, 930), 2)]  # fmt: skip
    first_p, first_q, second_q, second_p = simulate(layout, requests).requests
    assert (first_p.ttft, first_q.ttft) == pytest.approx((0.092, 0.092))
    assert (second_q.ttft, second_p.ttft) == pytest.approx((0.018, 0.018))


def test_a_prompt_chunk_is_priced_at_the_prefill_factor_and_decode_rows_at_the_step_factor():
    """One worker, steps of 10 ms + 1 ms per token; prompt tokens served at 1x, decode rows at 2x:
    prefill of 10 tokens 20 ms (0.020), then two decode rows of 11 ms at 2x (0.042, 0.064)."""
    base = hand_profile()
    profile = dataclasses.replace(base, serving=dataclasses.replace(base.serving, step_factor=2.0, prefill_factor=1.0))
    layout = Layout(PoolLayout(0, None), PoolLayout(1, profile), LIMITS, arrival_window=NO_WINDOW)
    (request,) = simulate(layout, [SimRequest(0.0, prompt(10), 3)]).requests
    assert request.token_times == pytest.approx([0.020, 0.042, 0.064])


def test_a_prompt_beside_a_decoding_worker_takes_the_calibrated_contention_longer():
    """Steps of 10 ms + 1 ms per token; a step with prompt tokens beside a decoding worker 5 ms + 1 ms per prompt
    token longer. A (10 tokens, a long stream) is prefilled alone (0.020); B (10 tokens) arrives at 0.05 while A
    decodes, and is prefilled on the other worker of the host in 20 + 15 ms, colocated or a prefill worker."""
    base = hand_profile()
    contended = dataclasses.replace(base, serving=dataclasses.replace(
        base.serving, prompt_contention_s=0.005, prompt_contention_per_token_s=0.001))  # fmt: skip
    requests = [SimRequest(0.0, prompt(10), 12), SimRequest(0.05, prompt(10, 900), 1)]

    def ttfts(profile, prefill_workers: int) -> tuple[float, float]:
        layout = Layout(PoolLayout(prefill_workers, profile if prefill_workers else None),
                        PoolLayout(2 - prefill_workers, profile), LIMITS, arrival_window=NO_WINDOW)  # fmt: skip
        a, b = simulate(layout, requests).requests
        return a.ttft, b.ttft

    assert ttfts(contended, 0) == pytest.approx((0.020, 0.035))
    assert ttfts(base, 0) == pytest.approx((0.020, 0.020))
    (a_alone, b_alone), (a_beside, b_beside) = ttfts(base, 1), ttfts(contended, 1)
    assert (a_beside - a_alone, b_beside - b_alone) == pytest.approx((0.0, 0.015))
