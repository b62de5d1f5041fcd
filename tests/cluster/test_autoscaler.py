from cluster.autoscaler import Autoscaler, PoolSignals, next_size, pool_signals
from cluster.spec import AutoscaleSpec, PoolAutoscale
from wire.membership import MemberView
from wire.requests import WorkerLoad

TARGET = PoolAutoscale(min_replicas=1, max_replicas=3, max_waiting_per_worker=4, max_kv_usage=0.8, max_latency_s=0.5)


def _state(waiting=0, free=100, total=100, alive=True):
    return MemberView("w", "", alive, False, 0, WorkerLoad("w", waiting, 0, 0, free, total, 0.0))


def test_signals_average_the_live_workers_of_the_pool_only():
    snapshot = {"p0": _state(waiting=6), "p1": _state(waiting=2), "p2": _state(waiting=50, alive=False),
                "d0": _state(free=10)}  # fmt: skip
    signals = pool_signals(["p0", "p1", "p2"], snapshot, latency_s=None)
    assert (signals.workers, signals.waiting, signals.kv_usage) == (2, 4.0, 0.0)
    assert pool_signals(["d0"], snapshot, None).kv_usage == 0.9


def test_prefill_grows_on_queued_prompts_or_slow_first_tokens_within_bounds():
    assert next_size("prefill", 1, PoolSignals(1, 5.0, 0.0, None), TARGET) == 2
    assert next_size("prefill", 1, PoolSignals(1, 0.0, 0.0, 0.9), TARGET) == 2  # TTFT above 0.5 s
    assert next_size("prefill", 3, PoolSignals(3, 9.0, 0.0, 2.0), TARGET) == 3  # at max_replicas
    assert next_size("prefill", 2, PoolSignals(2, 3.0, 0.0, None), TARGET) == 2  # below target, above half of it


def test_decode_grows_on_kv_usage_or_slow_tokens_and_shrinks_only_when_all_are_low():
    assert next_size("decode", 1, PoolSignals(1, 0.0, 0.9, None), TARGET) == 2
    assert next_size("decode", 1, PoolSignals(1, 0.0, 0.1, 0.6), TARGET) == 2  # TPOT above 0.5 s
    assert next_size("decode", 2, PoolSignals(2, 0.0, 0.1, 0.3), TARGET) == 2  # TPOT above half its target
    assert next_size("decode", 2, PoolSignals(2, 0.0, 0.1, 0.1), TARGET) == 1
    assert next_size("decode", 1, PoolSignals(1, 0.0, 0.0, None), TARGET) == 1  # min_replicas


def test_a_pool_turned_off_stays_off_and_decode_never_goes_below_one():
    off = PoolAutoscale(min_replicas=0, max_replicas=2)
    assert next_size("prefill", 0, PoolSignals(0, 0.0, 0.0, 9.0), off) == 0
    assert next_size("prefill", 1, PoolSignals(1, 0.0, 0.0, None), off) == 0
    assert next_size("decode", 1, PoolSignals(1, 0.0, 0.0, None), off) == 1


def test_the_autoscaler_diffs_latency_counters_and_keeps_a_cooldown_per_pool():
    spec = AutoscaleSpec(enabled=True, cooldown_s=10, prefill=TARGET, decode=TARGET)
    autoscaler = Autoscaler(spec)
    members = {"prefill": ["p0"], "decode": ["d0"]}
    snapshot = {"p0": _state(), "d0": _state()}
    sizes = {"prefill": 1, "decode": 1}
    slow_ttft = {"ttft": (10.0, 10.0), "tpot": (0.0, 0.0)}  # 1 s mean over 10 requests
    assert autoscaler.decide(sizes, members, snapshot, slow_ttft, now=100.0) == {"prefill": 2}
    # The same totals again: no request ended since, so no latency signal; and prefill is cooling down.
    assert autoscaler.decide({"prefill": 2, "decode": 1}, members, snapshot, slow_ttft, now=105.0) == {}
    faster = {"ttft": (10.4, 14.0), "tpot": (0.0, 0.0)}  # 4 more requests at 0.1 s: below half the target
    assert autoscaler.decide({"prefill": 2, "decode": 1}, members, snapshot, faster, now=111.0) == {"prefill": 1}
