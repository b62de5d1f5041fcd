"""What the engine returns: vLLM-shaped outputs, cumulative plus this step's delta.

The engine core fills token ids, logprobs and finish reasons; `text` is the
offline frontend's (`engine.llm.LLM`, through `output_text`): the core makes no text.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.sampler import TokenLogprobs


@dataclass
class CompletionOutput:
    index: int
    token_ids: list[int]
    finish_reason: str | None = None  # "stop", "length", "abort" or None while running
    stop_reason: int | str | None = None  # the stop token id (engine core) or stop string (LLM) that matched
    logprobs: list[TokenLogprobs | None] | None = None
    text: str = ""  # set by LLM on a finished output; "" from the engine core

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
    # params.prompt_logprobs: one entry per prompt token (the first is None), once the prompt is computed
    prompt_logprobs: list[TokenLogprobs | None] | None = None
