"""Requests in, token deltas out: the workers' control-call and token-stream messages.

    router ── GenerateRequest ──► decode.reserve ──► DecodeReservation | ReserveRefused
    router ── PrefillTask ──────► prefill ══ KV ══► decode
    prefill ── FirstToken | PrefillFailed ──► decode inbox (ZMQ PUSH/PULL)
    prefill ── TokenDelta(first token) ──► token stream;  decode ── TokenDelta ... finished ──► token stream
    router ── load ──► worker ──► WorkerLoad   (the heartbeat: `wire.liveness` reads it)
"""

from __future__ import annotations

import dataclasses
from typing import TypeVar

from wire.codec import message
from wire.sampling_rules import check_sampling

S = TypeVar("S")


@message
class SamplingSpec:
    """engine.SamplingParams on the wire, less what only shapes text (n is fanned out before: one request,
    one sequence). Stop strings, include_stop_str_in_output and skip_special_tokens stay in the router,
    which owns the text (`output_text`); workers stop on EOS, stop token ids and max/min tokens."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    max_tokens: int | None = 16
    min_tokens: int = 0
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias) pairs, sorted by id
    structured: tuple[str, str] | None = None  # (kind, spec): the grammar the output must match
    resumed_output_tokens: int = 0  # the prompt's last N tokens are output of an earlier attempt
    # The tenant's prefix-cache salt (wire.cache_salt): not sampling, but it goes wherever the sampling goes
    # (decode's reserve, prefill, a local prefill, a recompute, a resumed attempt), each engine hashing with it.
    cache_salt: str | None = None

    def __post_init__(self):
        check_sampling(self)  # raises SamplingOutOfRange: none out of range is ever made or decoded

    def continued(self, done: int) -> SamplingSpec | None:
        """The sampling of the same request once `done` of its output tokens were made (they become the end
        of the next attempt's prompt): what is left of max_tokens and min_tokens; None when no token is left
        to make. The one rule for a resumed request (`router.migration`) and a recompute on decode."""
        return continued(self, done)


@message
class GenerateRequest:
    request_id: str
    prompt_token_ids: tuple[int, ...]
    sampling: SamplingSpec
    stream_address: str  # the token-stream consumer's PULL socket
    # The router found no prefill worker able to take it (dead, restarting, draining, far behind):
    # the decode worker prefills the prompt itself, whatever its local_prefill_threshold.
    local_prefill: bool = False
    # An earlier attempt of it ended in a step that failed with it alone (`router.dispatch.Generation`): the
    # worker runs it alone until a step of its own samples (`engine.request.Request.suspect`), so that it
    # fails no batch of others, and a failure of its lone step is its own, not the worker's.
    suspect: bool = False


@message
class DecodeReservation:
    """Decode's answer to a reserve: where the prompt's KV goes, or that decode prefills it itself."""

    request_id: str
    prefill_locally: bool  # short uncached prompt: decode computes it, no prefill worker involved
    kv_address: str = ""  # the decode receiver's address
    inbox_address: str = ""  # decode's PULL socket for FirstToken / PrefillFailed
    block_ids: tuple[int, ...] = ()  # destination blocks, for prompt blocks num_cached_blocks onwards
    num_cached_blocks: int = 0  # leading prompt blocks decode already holds (its prefix cache)
    # Tensor-parallel decode: every rank's receiver address, rank order (kv_addresses[0] == kv_address),
    # each rank takes its own KV heads into the same block ids. Empty: one rank, at kv_address.
    kv_addresses: tuple[str, ...] = ()
    tp_size: int = 1
    # With a cluster key: the secret a KV chunk or sender's Abort for this request must carry
    # (wire.socket_security.transfer_token); only the router and the prefill worker it chose learn it.
    transfer_token: str = dataclasses.field(default="", repr=False)

    def rank_addresses(self) -> tuple[str, ...]:
        """The decode ranks' KV addresses, rank order (one entry for a TP=1 decode worker)."""
        return self.kv_addresses or (self.kv_address,)


@message
class ReserveRefused:
    request_id: str
    reason: str
    retryable: bool  # True: no free blocks now; False: the request can never run here
    # The worker cannot take it now, nor within a retry's wait (its grammar compiles are full): the client
    # gets 503 with Retry-After at once. Also prefill's answer when it refuses a task so.
    busy: bool = False


@message
class PrefillTask:
    request: GenerateRequest
    reservation: DecodeReservation


@message
class FirstToken:
    request_id: str
    token_id: int
    transfer_token: str = dataclasses.field(default="", repr=False)  # the reservation's: decode takes no other


@message
class PrefillFailed:
    request_id: str
    reason: str
    transfer_token: str = dataclasses.field(default="", repr=False)  # the reservation's: decode takes no other


@message
class TokenLogprob:
    """One token's logprob under the raw distribution, and the top alternatives (token id, logprob); `rank`
    (1 + the tokens more likely) is given for prompt tokens."""

    logprob: float
    top: tuple[tuple[int, float], ...] = ()
    rank: int = 0


@message
class PhaseTimes:
    """Seconds one worker measured of one request's phases, on its own clock; phases it did not see are 0.

    Prefill (with the first token): `queue_s` from the task's arrival to the first step that computed any
    of the prompt, `prefill_s` from there to the end of the step that sampled the first token. Decode (with
    the final delta): `kv_transfer_s` from the first token's arrival to the KV's (0 when the KV came first),
    `decode_seat_s` from both being in to the request's admission into the running batch, `first_decode_s`
    from there to the end of the step that made its second token; a prompt decode prefilled itself also
    gets `queue_s` and `prefill_s` (measured from its reserve), and `first_decode_s` from its first token."""

    queue_s: float = 0.0
    prefill_s: float = 0.0
    kv_transfer_s: float = 0.0
    decode_seat_s: float = 0.0
    first_decode_s: float = 0.0


# Prompt logprobs per token-stream delta. An entry with MAX_LOGPROBS alternatives encodes to at most 419 bytes
# (64-bit ids and rank; tests/wire/test_prompt_logprob_pieces.py), so a piece stays under 2 MiB, half the
# stream's 4 MiB frame bound (`wire.socket_security.SMALL_MESSAGE_BYTES`); a 13k-token prompt's were over it.
PROMPT_LOGPROBS_PER_DELTA = 4096


@message
class TokenDelta:
    """New output tokens of one request; the last one has `finished` and the usage counts."""

    request_id: str
    first_index: int  # output index of token_ids[0]: deltas from prefill and decode may cross
    token_ids: tuple[int, ...]
    finished: bool = False
    finish_reason: str | None = None  # "stop", "length" or "abort"
    num_prompt_tokens: int = 0
    num_output_tokens: int = 0
    num_cached_tokens: int = 0
    error: str = ""  # why an aborted request ended, when not by the client
    logprobs: tuple[TokenLogprob, ...] = ()  # one per token id, when the request asked for logprobs
    # An abort the worker could not help (its step failed): another worker may resume the request.
    resumable: bool = False
    # With the first output token, when the request asked for prompt logprobs: one per prompt token, the
    # first None (nothing precedes it to score it).
    prompt_logprobs: tuple[TokenLogprob | None, ...] = ()
    phases: PhaseTimes | None = None  # the prefill worker's with the first token, decode's with the final delta
    # The prompt index of prompt_logprobs[0]: a long prompt's logprobs come in pieces (`in_pieces`).
    prompt_logprobs_from: int = 0

    def in_pieces(self) -> tuple[TokenDelta, ...]:
        """This delta as the token stream sends it: each under the stream's frame bound (a larger frame makes
        libzmq drop the sender's connection). Prompt logprobs past one piece go first, in deltas of their own
        with no tokens, in prompt order; the last piece rides with this delta's tokens, so the delta that
        carries tokens is the one that completes them (one sender's deltas arrive in the order sent)."""
        entries = self.prompt_logprobs
        if len(entries) <= PROMPT_LOGPROBS_PER_DELTA:
            return (self,)
        starts = range(0, len(entries), PROMPT_LOGPROBS_PER_DELTA)
        pieces = [TokenDelta(self.request_id, self.first_index, (), prompt_logprobs_from=start,
                             prompt_logprobs=entries[start : start + PROMPT_LOGPROBS_PER_DELTA])
                  for start in starts[:-1]]  # fmt: skip
        last = dataclasses.replace(self, prompt_logprobs=entries[starts[-1] :], prompt_logprobs_from=starts[-1])
        return (*pieces, last)

    def shifted(self, done: int) -> TokenDelta:
        """This delta of an attempt that continues after `done` output tokens (its prompt ends with them),
        numbered as the whole request: its output indices and counts move past them. Its prompt logprobs
        would score those tokens as prompt, so they go (the request's own came with its first attempt)."""
        if not done:
            return self
        return dataclasses.replace(
            self, first_index=self.first_index + done, num_prompt_tokens=self.num_prompt_tokens - done,
            num_output_tokens=self.num_output_tokens + done,
            num_cached_tokens=min(self.num_cached_tokens, self.num_prompt_tokens - done), prompt_logprobs=(),
        )  # fmt: skip


@message
class WorkerLoad:
    """What routing needs from a worker."""

    name: str
    waiting: int  # queued for compute, for KV, or for its grammar to compile
    running: int
    transferring: int  # prefill: requests whose KV is still moving
    free_blocks: int
    total_blocks: int
    prefix_cache_hit_rate: float
    # Decode: KV transfers received since the worker started (tensor parallel: rank 0's heads only),
    # their bytes, and the sum of their durations (first landed chunk to last). Prefill: zeros.
    kv_transfers: int = 0
    kv_transfer_bytes: int = 0
    kv_transfer_seconds: float = 0.0
    # Liveness, answered by the worker's I/O thread while its loop may be inside a long step:
    # steps finished since start, how long the step in progress has run (0: between steps), the
    # longest step so far, and steps that failed in a row (a sticky device error keeps failing).
    steps: int = 0
    step_running_s: float = 0.0
    longest_step_s: float = 0.0
    failed_steps_in_a_row: int = 0
    # Its prompt rate (`engine.prefill_meter`), cumulative since start: prompt tokens its steps advanced
    # and the wall time of those steps. The router predicts time to first token from them.
    prompt_tokens_advanced: int = 0
    prompt_seconds: float = 0.0
    # What its internal sockets refused since start (`wire.socket_security.refusals`): (socket kind, reason,
    # count) rows, exported on the router's /metrics under this worker's name.
    refused: tuple[tuple[str, str, int], ...] = ()


def continued(sampling: S, done: int) -> S | None:
    """`SamplingSpec.continued`, for any sampling of the same field names (the engine's `SamplingParams` too)."""
    left = None if sampling.max_tokens is None else sampling.max_tokens - done
    if left is not None and left <= 0:
        return None
    return dataclasses.replace(sampling, max_tokens=left, min_tokens=max(0, sampling.min_tokens - done),
                               resumed_output_tokens=sampling.resumed_output_tokens + done)  # fmt: skip
