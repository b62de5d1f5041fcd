"""A long prompt's logprobs leave a worker in pieces, each delta under the token stream's frame bound."""

from __future__ import annotations

from wire.codec import decode, encode
from wire.requests import PROMPT_LOGPROBS_PER_DELTA, PhaseTimes, TokenDelta, TokenLogprob
from wire.sampling_rules import MAX_LOGPROBS
from wire.socket_security import SMALL_MESSAGE_BYTES

# The largest entry the codec can be handed: every alternative asked for, 64-bit ids and rank.
WORST_ENTRY = TokenLogprob(-1.5, tuple((2**63 - 1, -2.5) for _ in range(MAX_LOGPROBS)), 2**63 - 1)
TOP = tuple((150_000 + j, -1.0 - j) for j in range(MAX_LOGPROBS))


def _delta_with_prompt(num_prompt_tokens: int) -> TokenDelta:
    # Ids and ranks of a 150k-token vocabulary (a real model's), every alternative asked for.
    entries = (None, *(TokenLogprob(-0.5 - i, TOP, 100_000 + i)
                       for i in range(num_prompt_tokens - 1)))
    return TokenDelta("r", 0, (7,), logprobs=(WORST_ENTRY,), prompt_logprobs=entries, phases=PhaseTimes(1.0, 2.0))


def test_a_piece_of_the_largest_entries_fits_well_under_the_frame_bound():
    assert len(encode(WORST_ENTRY)) <= 419  # the size PROMPT_LOGPROBS_PER_DELTA is reckoned from
    piece = TokenDelta("r" * 64, 0, (7,), logprobs=(WORST_ENTRY,), phases=PhaseTimes(),
                       prompt_logprobs=(WORST_ENTRY,) * PROMPT_LOGPROBS_PER_DELTA)  # fmt: skip
    assert len(encode(piece)) < SMALL_MESSAGE_BYTES // 2


def test_a_long_prompts_logprobs_split_into_pieces_that_each_fit_and_rejoin_in_order():
    delta = _delta_with_prompt(13_000)
    assert len(encode(delta)) > SMALL_MESSAGE_BYTES  # one frame: libzmq would drop the sender's connection
    pieces = delta.in_pieces()
    assert len(pieces) == 4 and all(len(encode(p)) < SMALL_MESSAGE_BYTES for p in pieces)
    decoded = [decode(encode(p), TokenDelta) for p in pieces]
    assert sum((p.prompt_logprobs for p in decoded), ()) == delta.prompt_logprobs
    assert [p.prompt_logprobs_from for p in decoded] == [0, 4096, 8192, 12288]
    # Only the last carries the tokens and the rest of the delta: the one that completes the prompt's logprobs.
    assert all(p.token_ids == () and p.logprobs == () and p.phases is None for p in decoded[:-1])
    last = decoded[-1]
    assert (last.token_ids, last.logprobs, last.phases) == (delta.token_ids, delta.logprobs, delta.phases)


def test_a_delta_that_fits_goes_as_it_is():
    delta = _delta_with_prompt(PROMPT_LOGPROBS_PER_DELTA)
    assert delta.in_pieces() == (delta,)
    plain = TokenDelta("r", 3, (1, 2))
    assert plain.in_pieces() == (plain,)
