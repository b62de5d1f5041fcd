"""One generation request as the engine tracks it.

A request has no prefill or decode phase: `num_computed_tokens` says how many
of its tokens (prompt then outputs) have KV in the cache, and each step the
scheduler lets it catch up towards `num_tokens`.
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field

from engine.block_pool import BlockHash, KVBlock
from engine.sampler import SamplingState, TokenLogprobs
from engine.sampling_params import SamplingParams


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"
    WAITING_FOR_KV = "waiting_for_kv"  # decode role: blocks reserved, prompt KV arriving from a prefill worker
    FINISHED_STOPPED = "stop"
    FINISHED_LENGTH = "length"
    FINISHED_ABORTED = "abort"

    @property
    def is_finished(self) -> bool:
        return self in (RequestStatus.FINISHED_STOPPED, RequestStatus.FINISHED_LENGTH, RequestStatus.FINISHED_ABORTED)


@dataclass(eq=False)
class Request:
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    max_tokens: int  # resolved from params.max_tokens and max_model_len
    eos_token_ids: tuple[int, ...] = ()
    arrival_time: float = field(default_factory=time.monotonic)
    status: RequestStatus = RequestStatus.WAITING
    output_token_ids: list[int] = field(default_factory=list)
    output_logprobs: list[TokenLogprobs | None] = field(default_factory=list)
    # params.prompt_logprobs: one entry per prompt token computed so far (the first token's is None)
    prompt_logprobs: list[TokenLogprobs | None] = field(default_factory=list)
    num_computed_tokens: int = 0
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache at first scheduling
    num_preemptions: int = 0
    # A step it was in failed beside other requests (or an earlier attempt's did, on any worker: the router says
    # so, `wire.requests.GenerateRequest.suspect`): it runs alone (`Scheduler`) until a step of its own samples
    # a token, so that a failure is blamed on the request that causes it, not on its company.
    suspect: bool = False
    failed_steps: int = 0  # steps that failed with it in them
    blocks: list[KVBlock] = field(default_factory=list)
    num_offered_blocks: int = 0  # leading `blocks` already offered to the prefix cache (KVCacheManager)
    block_hashes: list[BlockHash] = field(default_factory=list)  # chain hashes of full token blocks
    stop_reason: int | str | None = None
    # Prefill role: finishing leaves `blocks` held for a KV transfer; the caller frees them (engine.remote_kv).
    hold_blocks: bool = False
    # On the engine's clock (`LLMEngine.clock`), for the phases a worker reports: when a step first computed
    # some of it, and the end of the steps that made its first and second output tokens (a first token
    # sampled elsewhere counts when `admit_remote_kv` takes it).
    first_scheduled_at: float | None = None
    first_token_at: float | None = None
    second_token_at: float | None = None

    def __post_init__(self):
        self.sampling = SamplingState.create(
            self.params, self.prompt_token_ids, self.output_token_ids, self.eos_token_ids
        )

    @property
    def all_token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def is_finished(self) -> bool:
        return self.status.is_finished

    @property
    def finish_reason(self) -> str | None:
        return self.status.value if self.is_finished else None
