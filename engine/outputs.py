"""What the engine returns: vLLM-shaped outputs, cumulative plus this step's delta."""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.sampler import TokenLogprobs


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None = None  # "stop", "length", "abort" or None while running
    stop_reason: int | str | None = None  # the stop token id or stop string that matched
    logprobs: list[TokenLogprobs | None] | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool = False
    num_cached_tokens: int = 0
    new_token_ids: list[int] = field(default_factory=list)  # produced in the step that returned this
    new_text: str = ""
