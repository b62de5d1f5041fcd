"""An attempt's counts on its workers follow its phase, and go back exactly once however it ends."""

import itertools

import pytest

from router.attempt import HOLDS, TRANSITIONS, Attempt, AttemptPhase
from router.worker_state import WorkerState

PROMPT = 100


def _workers():
    return WorkerState("decode-0", "decode"), WorkerState("prefill-0", "prefill")


def _counts(decode, prefill):
    return (decode.in_flight, decode.prompt_tokens_queued, prefill.in_flight, prefill.prompt_tokens_queued)


def test_a_disaggregated_attempt_charges_prefill_until_the_first_token_and_holds_it_until_decodes_first():
    decode, prefill = _workers()
    attempt = Attempt("r-1", decode, prefill, PROMPT)
    assert attempt.phase is AttemptPhase.PREFILL_REMOTE and _counts(decode, prefill) == (1, 0, 1, PROMPT)
    attempt.tokens_out(1)  # the prefill worker's token
    assert attempt.phase is AttemptPhase.KV_ARRIVING and _counts(decode, prefill) == (1, 0, 1, 0)
    assert attempt.holding_prefill is prefill
    attempt.tokens_out(2)  # decode's first: the KV landed
    assert attempt.phase is AttemptPhase.DECODING and _counts(decode, prefill) == (1, 0, 0, 0)
    assert attempt.holding_prefill is None and attempt.prefill is prefill and attempt.workers == [decode]
    attempt.tokens_out(7)
    attempt.end()
    attempt.end()
    assert attempt.ended and _counts(decode, prefill) == (0, 0, 0, 0)


def test_a_prompt_decode_takes_over_moves_its_charge_to_decode():
    decode, prefill = _workers()
    attempt = Attempt("r-1", decode, prefill, PROMPT)
    attempt.prefill_locally()
    assert attempt.phase is AttemptPhase.PREFILL_LOCAL and _counts(decode, prefill) == (1, PROMPT, 0, 0)
    attempt.tokens_out(1)
    assert attempt.phase is AttemptPhase.DECODING and _counts(decode, prefill) == (1, 0, 0, 0)


def test_a_colocated_attempt_charges_decode():
    decode = WorkerState("decode-0", "decode")
    attempt = Attempt("r-1", decode, None, PROMPT)
    assert attempt.phase is AttemptPhase.PREFILL_LOCAL and (decode.in_flight, decode.prompt_tokens_queued) == (1, PROMPT)
    attempt.end()
    assert (decode.in_flight, decode.prompt_tokens_queued) == (0, 0)


def test_two_tokens_in_one_chunk_end_prefills_part_at_once():
    decode, prefill = _workers()
    Attempt("r-1", decode, prefill, PROMPT).tokens_out(2)
    assert _counts(decode, prefill) == (1, 0, 0, 0)


EVENTS = ("prefill_locally", "first_token", "second_token", "end")


@pytest.mark.parametrize("events", list(itertools.product(EVENTS, repeat=3)))
def test_whatever_happens_every_count_is_given_back_once_at_the_end(events):
    decode, prefill = _workers()
    attempt = Attempt("r-1", decode, prefill, PROMPT)
    for event in events:
        attempt._event(event)
        holds = HOLDS[attempt.phase]
        charged = {"decode": (PROMPT, 0), "prefill": (0, PROMPT), None: (0, 0)}[holds.charged]
        assert _counts(decode, prefill) == (int(holds.decode), charged[0], int(holds.prefill), charged[1])
    attempt.end()
    assert _counts(decode, prefill) == (0, 0, 0, 0)


def test_every_phase_but_the_last_can_end_and_only_ended_holds_nothing():
    for phase in AttemptPhase:
        assert TRANSITIONS[(phase, "end")] is AttemptPhase.ENDED
    assert [p for p in AttemptPhase if HOLDS[p] == HOLDS[AttemptPhase.ENDED]] == [AttemptPhase.ENDED]
