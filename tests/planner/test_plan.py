"""`tandem plan` picks what the workload and the SLO call for, and refuses what no layout can meet."""

from __future__ import annotations

import pytest

from planner.plan import make_plan
from planner.search import WorkerKind, layouts
from planner.slo import SLO
from planner.workload import SimRequest, WorkloadSpec
from tests.planner.profiles import TINY_DIMS, hand_profile

ONE_DEVICE = [WorkerKind(hand_profile(message_s=0.0005, kv_cache_tokens=32768), 1, "GPU")]


def tokens(n: int, seed: int = 0) -> tuple[int, ...]:
    """`n` token ids of the tiny vocabulary; no two seeds share a block."""
    import random

    rng = random.Random(seed)
    return tuple(rng.randrange(100, TINY_DIMS.vocab_size) for _ in range(n))


def test_long_prompts_during_long_outputs_with_a_bound_on_stalls_disaggregate():
    """A 500-token prompt is a half-second step: on a worker that also decodes, its streams stall for it."""
    streams = [SimRequest(0.1 * i, tokens(50, seed=i), 200) for i in range(2)]
    prompts = [SimRequest(0.3 + 0.5 * i, tokens(500, seed=10 + i), 2) for i in range(10)]  # over 1% of the ITLs
    plan = make_plan(ONE_DEVICE, streams + prompts, SLO.parse("itl_p99=200ms"), budget=2)
    assert plan.best is not None and not plan.best.layout.colocated
    colocated = [e for e in plan.evaluations if e.layout.colocated]
    assert colocated and all(not e.meets and "itl" in e.misses[0] for e in colocated)


def test_short_prompts_with_a_bound_on_tpot_stay_colocated():
    """Short prompts cost a prefill worker nothing worth a device; decode steps grow with their rows."""
    requests = WorkloadSpec(num_prompts=60, random_input_len=16, random_output_len=100, request_rate=20,
                            ignore_eos=True).requests(TINY_DIMS.vocab_size)  # fmt: skip
    plan = make_plan(ONE_DEVICE, requests, SLO.parse("tpot_p90=30ms"), budget=3)
    assert plan.best is not None and plan.best.layout.colocated
    disaggregated = [e for e in plan.evaluations if not e.layout.colocated and e.devices == plan.best.devices]
    assert all(e.goodput_per_device <= plan.best.goodput_per_device for e in disaggregated)


def test_an_slo_no_idle_server_can_meet_is_an_error_naming_it():
    requests = [SimRequest(0.0, tokens(500), 10)]  # a 500-token prompt: a 510 ms step
    with pytest.raises(ValueError, match=r"--slo ttft_p90=100ms: even alone on an idle server.* ttft is 5[12]\d ms"):
        make_plan(ONE_DEVICE, requests, SLO.parse("ttft_p90=100ms,tpot_p90=1s"), budget=2)


@pytest.mark.parametrize("text, named", [("ttft=2s", "ttft=2s"), ("ttft_p90=2", "ttft_p90=2"),
                                         ("goodness_p90=1s", "goodness_p90"), ("tpot_p101=1s", "percentile"),
                                         ("", "at least one")])  # fmt: skip
def test_a_bad_slo_names_its_term(text, named):
    with pytest.raises(ValueError, match=named):
        SLO.parse(text)


def test_the_search_stays_within_the_budget_and_mixes_device_types():
    cheap, fast = hand_profile(), hand_profile(fixed_s=0.005)
    kinds = [WorkerKind(cheap, 1, "GPU"), WorkerKind(fast, 2, "GPU")]
    found = list(layouts(kinds, budget=4))
    assert all(sum(p.replicas * (1 if p.profile is cheap else 2) for p in (l.prefill, l.decode) if p.replicas) <= 4
               for l in found)  # fmt: skip
    assert any(l.prefill.profile is fast and l.decode.profile is cheap for l in found if not l.colocated)
    assert sum(l.colocated for l in found) == 4 + 2
