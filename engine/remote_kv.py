"""Engine roles for disaggregated serving: prefill that hands its KV away, decode that takes KV in.

Prefill role (`add_prefill_request` / `release_blocks`): the request runs its
prompt (chunked, prefix-cached, batched with others as usual), samples its
first token and finishes, but its blocks stay held (`Request.hold_blocks`):
not freed, not reused, while the KV transfer reads them. Its full blocks are
registered in the prefix cache at the same step as any request's, so later
prompts hit them. The caller owns the held blocks from the step that finishes
the request (or from `abort_request` / an `EngineStepError` naming it) and
returns them with `release_blocks` once the transfer has ended (any
`sender.poll()` event), or at once if no transfer started.

Decode role (`reserve_remote_kv` / `admit_remote_kv` / `fail_remote_kv`): the
request gets blocks for its whole prompt, local prefix-cache hits first, and
waits in the scheduler's `waiting_for_kv` queue, never scheduled, so it never
stalls the running batch. Once its KV has landed it joins the running batch
(when a seat is free) with the prompt computed and the first token (sampled
by the prefill worker) as its first output. The engine owns the reserved
blocks from `reserve_remote_kv`; `fail_remote_kv` (or `abort_request`) frees
them, after the caller has made sure no write into them is in flight (the
receiver released the reservation or reported its end).
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.kv_cache_manager import cdiv
from engine.llm_engine import LLMEngine, Prompt
from engine.outputs import RequestOutput
from engine.request import Request, RequestStatus
from engine.sampling_params import SamplingParams


class NoFreeBlocks(RuntimeError):
    """The decode engine cannot reserve the request's blocks now; retrying later may succeed."""


@dataclass(frozen=True)
class KVReservation:
    request_id: str
    block_ids: tuple[int, ...]  # every block of the prompt, in order
    num_cached_blocks: int  # leading blocks already filled from our prefix cache: not transferred
    num_uncached_tokens: int  # prompt tokens whose KV must come from elsewhere

    @property
    def transfer_block_ids(self) -> tuple[int, ...]:
        return self.block_ids[self.num_cached_blocks :]


# ---- prefill role --------------------------------------------------------


def add_prefill_request(engine: LLMEngine, request_id: str, prompt: Prompt, params: SamplingParams,
                        grammar=None) -> Request:  # fmt: skip
    """Queue a prompt that ends after its first token, its blocks held for the caller (see module doc).
    `grammar`: as `LLMEngine.new_request`'s."""
    req = engine.new_request(request_id, prompt, params, grammar)
    req.max_tokens = 1  # validated against the full max_tokens above; this engine only starts it
    req.hold_blocks = True
    engine.scheduler.add_request(req)
    return req


def release_blocks(engine: LLMEngine, req: Request) -> None:
    """Return a held request's blocks (the transfer is over); its full blocks stay prefix-cached."""
    if req.hold_blocks:
        req.hold_blocks = False
        engine.kv_cache.free(req)


# ---- decode role ---------------------------------------------------------


def count_uncached_tokens(engine: LLMEngine, prompt_token_ids: list[int], cache_salt: str | None = None) -> int:
    """Prompt tokens a new request would have to compute, given our prefix cache (a read-only probe); a salted
    request (`cache_salt`) counts only the blocks its own salt cached."""
    probe = Request("", list(prompt_token_ids), SamplingParams(cache_salt=cache_salt), max_tokens=1)
    hits = engine.kv_cache.find_cached_prefix(probe)
    return len(prompt_token_ids) - len(hits) * engine.kv_cache.block_size


def reserve_remote_kv(engine: LLMEngine, request_id: str, prompt: Prompt, params: SamplingParams,
                      grammar=None) -> KVReservation:  # fmt: skip
    """Register the request and reserve blocks for its prompt; raise `NoFreeBlocks` (nothing kept) if full.
    `grammar`: as `LLMEngine.new_request`'s."""
    req = engine.new_request(request_id, prompt, params, grammar)
    kv = engine.kv_cache
    cached = kv.find_cached_prefix(req)
    num_cached_tokens = len(cached) * kv.block_size
    if not kv.allocate_slots(req, req.num_prompt_tokens - num_cached_tokens, cached):
        engine.abort_request(request_id)
        raise NoFreeBlocks(
            f"decode engine has {kv.num_free_blocks} free KV blocks, request {request_id} needs "
            f"{cdiv(req.num_prompt_tokens - num_cached_tokens, kv.block_size)}"
        )
    engine.scheduler.wait_for_kv(req)
    req.num_cached_tokens = num_cached_tokens
    kv.pool.record_query(req.num_prompt_tokens, num_cached_tokens)
    return KVReservation(
        request_id,
        tuple(b.block_id for b in req.blocks),
        len(cached),
        req.num_prompt_tokens - num_cached_tokens,
    )


def admit_remote_kv(engine: LLMEngine, request_id: str, first_token: int) -> RequestOutput | None:
    """The prompt's KV has landed: join the running batch with `first_token` as the first output.

    Returns that output (it may already be finished: EOS, max_tokens=1), or None when the
    running batch has no free seat (nothing changed: admit it again later)."""
    req = engine.requests[request_id]
    if req.status != RequestStatus.WAITING_FOR_KV:
        raise ValueError(f"request {request_id} is {req.status.value}, not waiting for KV")
    if not engine.scheduler.admit_remote(req):
        return None
    # Stop checks (EOS, stop token ids, max_tokens) and finishing are the engine's, as for a locally sampled token.
    return engine._append_token(req, first_token, None)


def fail_remote_kv(engine: LLMEngine, request_id: str) -> bool:
    """End a request waiting for KV and free its reservation; the caller ensured no write is in flight."""
    return engine.abort_request(request_id)


def waiting_for_kv(engine: LLMEngine) -> list[str]:
    return list(engine.scheduler.waiting_for_kv)
