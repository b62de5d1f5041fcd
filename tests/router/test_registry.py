"""The registry's judgement of its workers: busy is not dead, a failed call is suspect, a verdict is dead.

Fake endpoints stand for the workers (their `load()` answers, fails or never
returns as a test sets it); the liveness clock is injected, so a minute of
silence is one assignment, not a minute.
"""

from __future__ import annotations

import asyncio

import pytest

from router.control_client import CallFailed, CallRejected, CallTimedOut, WorkerGone
from wire.liveness import LivenessPolicy
from wire.requests import DecodeReservation, GenerateRequest, SamplingSpec, WorkerLoad
from router.policy import make_policy
from router.registry import WorkerFailed, WorkerRegistry

POLICY = LivenessPolicy()  # the defaults the router runs with: 3 misses, 30 s silence, 300 s step floor
POLL_TIMEOUT_S = 0.05


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class FakeWorker:
    """An endpoint: `load()` answers `self.load_reply`, raises `self.error`, or never returns (`hang`)."""

    def __init__(self, name: str):
        self.load_reply = WorkerLoad(name, 0, 0, 0, 40, 40, 0.0)
        self.error: Exception | None = None
        self.hang = False
        self.reserved: list[GenerateRequest] = []

    async def load(self) -> WorkerLoad:
        if self.hang:
            await asyncio.Event().wait()
        if self.error is not None:
            raise self.error
        return self.load_reply

    async def reserve(self, request: GenerateRequest) -> DecodeReservation:
        if self.error is not None:
            raise self.error
        self.reserved.append(request)
        return DecodeReservation(request.request_id, prefill_locally=True)

    async def abort(self, request_id: str) -> None:
        pass


def _registry(*names: str) -> tuple[WorkerRegistry, dict[str, FakeWorker], Clock, list[str]]:
    clock, dead = Clock(), []
    registry = WorkerRegistry(make_policy("round_robin"), liveness=POLICY, clock=clock)
    registry.on_dead(lambda state: dead.append(state.name))
    fakes = {name: FakeWorker(name) for name in names}
    for name, fake in fakes.items():
        registry.register(name, "decode", fake)
    return registry, fakes, clock, dead


def _poll(registry: WorkerRegistry) -> None:
    asyncio.run(registry.refresh_loads(POLL_TIMEOUT_S))


def test_a_slow_but_answering_worker_is_never_marked_dead():
    """A 250 s step (its longest before was 100 s), answered heartbeats in between, a few polls without
    an answer (the answer came after the poll's timeout) but never three in a row: alive all along."""
    registry, fakes, clock, dead = _registry("busy")
    busy = fakes["busy"]
    for second in range(0, 250, 5):
        clock.now += 5
        busy.hang = second % 30 in (10, 15)  # two polls in a row go unanswered, then one is answered
        busy.load_reply = WorkerLoad("busy", 3, 1, 0, 10, 40, 0.0, steps=7, step_running_s=second,
                                     longest_step_s=100.0)  # fmt: skip
        _poll(registry)
        assert registry.workers["busy"].alive, f"marked dead {second} s into its step"
    busy.hang = False
    _poll(registry)
    assert dead == [] and not registry.workers["busy"].suspect


def test_refused_three_polls_in_a_row_is_dead():
    registry, fakes, _, dead = _registry("gone", "fine")
    fakes["gone"].error = WorkerGone("the address refuses connections", refused=True)
    for _ in range(POLICY.misses_before_dead - 1):
        _poll(registry)
        state = registry.workers["gone"]
        assert state.alive and state.suspect
    _poll(registry)
    assert dead == ["gone"] and not registry.workers["gone"].alive and registry.workers["fine"].alive


def test_unanswered_polls_are_dead_only_once_the_worker_was_silent_long_enough():
    """Misses without a refusal (a stopped process, a dead host): dead after `silent_after_s`, not before."""
    registry, fakes, clock, dead = _registry("silent")
    fakes["silent"].hang = True
    for _ in range(5):
        clock.now += 1
        _poll(registry)
    assert dead == [] and registry.workers["silent"].suspect
    clock.now += POLICY.silent_after_s
    _poll(registry)
    assert dead == ["silent"]


def test_a_worker_that_answers_but_is_wedged_or_failing_every_step_is_dead():
    registry, fakes, _, dead = _registry("wedged", "failing", "fine")
    fakes["wedged"].load_reply = WorkerLoad("wedged", 1, 1, 0, 10, 40, 0.0, steps=9, step_running_s=900.0,
                                            longest_step_s=20.0)  # fmt: skip
    fakes["failing"].load_reply = WorkerLoad("failing", 1, 1, 0, 10, 40, 0.0, steps=9,
                                             failed_steps_in_a_row=POLICY.max_failed_steps)  # fmt: skip
    _poll(registry)
    assert sorted(dead) == ["failing", "wedged"] and registry.workers["fine"].alive


@pytest.mark.parametrize("error", [WorkerGone("connection dropped"), CallTimedOut("no reply"), CallFailed("boom")])
def test_a_failed_dispatch_call_makes_the_worker_suspect_not_dead_until_a_good_poll(error):
    registry, fakes, _, dead = _registry("flaky", "steady")
    request = GenerateRequest("r-1", (1, 2, 3), SamplingSpec(), "tcp://127.0.0.1:1")
    fakes["flaky"].error = error
    with pytest.raises(WorkerFailed) as failed:
        asyncio.run(registry.workers["flaky"].endpoint.reserve(request))
    assert failed.value.worker == "flaky"
    flaky = registry.workers["flaky"]
    assert flaky.alive and flaky.suspect and dead == []
    assert {registry.pick_decode(request.prompt_token_ids).name for _ in range(4)} == {"steady"}
    fakes["flaky"].error = None
    _poll(registry)
    assert not flaky.suspect
    registry.workers["steady"].in_flight = 5  # now the busier one: the cleared worker is picked again
    assert registry.pick_decode(request.prompt_token_ids).name == "flaky"


def test_a_rejected_call_is_the_requests_fault_and_the_worker_stays_trusted():
    registry, fakes, _, _ = _registry("strict")
    fakes["strict"].error = CallRejected("bad sampling values")
    with pytest.raises(CallRejected):
        asyncio.run(registry.workers["strict"].endpoint.reserve(GenerateRequest("r", (1,), SamplingSpec(), "x")))
    assert registry.trusted("decode") == [registry.workers["strict"]]


def test_a_suspect_decode_worker_is_still_picked_when_it_is_the_only_one():
    registry, _, _, _ = _registry("only")
    registry.mark_suspect("only", "a call failed")
    assert registry.trusted("decode") == [] and registry.pick_decode([1, 2]).name == "only"
