"""A sequence's phases: the workers' measures and the router's ends, adding up to its end-to-end time."""

from __future__ import annotations

import pytest

from router.phases import RequestPhases
from wire.requests import PhaseTimes


def test_disaggregated_phases_add_up_to_the_end_to_end_time():
    prompt = PhaseTimes(queue_s=0.05, prefill_s=0.30)
    decode = PhaseTimes(kv_transfer_s=0.02, decode_seat_s=0.01, first_decode_s=0.04)
    phases = RequestPhases.of(e2e_s=1.0, ttft_s=0.40, prompt=prompt, decode=decode)
    assert phases.queue_s == pytest.approx(0.10)  # the router's and the hops' time count as queueing too
    assert (phases.prefill_s, phases.kv_transfer_s, phases.decode_seat_s, phases.first_decode_s) == (0.30, 0.02, 0.01, 0.04)
    assert phases.decode_s == pytest.approx(0.53) and phases.total_s == pytest.approx(1.0) and phases.adds_up


def test_a_prompt_decode_prefilled_itself_takes_its_prefill_from_decode():
    phases = RequestPhases.of(1.0, 0.2, None, PhaseTimes(queue_s=0.01, prefill_s=0.15, first_decode_s=0.05))
    assert phases.prefill_s == 0.15 and phases.queue_s == pytest.approx(0.05) and phases.total_s == pytest.approx(1.0)


def test_a_worker_measure_longer_than_the_routers_interval_does_not_add_up():
    phases = RequestPhases.of(e2e_s=0.5, ttft_s=0.2, prompt=PhaseTimes(prefill_s=0.3), decode=None)
    assert not phases.adds_up and phases.queue_s == 0.0
