"""The OpenAI request and response bodies (pydantic), as the official client sends and reads them.

Fields OpenAI (or vLLM) defines but Tandem does not honour (the deprecated
`functions` and `function_call`) are declared here so that they are never silently
dropped: accepted when left at their neutral values, refused (400 naming the
field) otherwise (`router.openai_common.refuse_unsupported`). Unknown fields are
ignored, as OpenAI's own server does for forward compatibility. A few vLLM
extensions (`top_k`, `min_tokens`, `ignore_eos`, ...) come through the client's
`extra_body`.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag

from wire.cache_salt import MAX_CACHE_SALT_CHARS

# ---- requests ---------------------------------------------------------------

MAX_MESSAGES = 16_384
MAX_TOOLS = 128  # OpenAI's own bound on the functions one request may declare


class StreamOptions(BaseModel):
    include_usage: bool = False


class _GenerationFields(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: str
    n: int = Field(1, ge=1, le=128)
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    # The sampling parameters' ranges are checked once, where the wire's SamplingSpec is made
    # (router.openai_common.sampling_from, wire.sampling_rules): a 400 naming the field.
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict[str, float] | None = None
    user: str | None = None
    # vLLM extensions
    top_k: int = 0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    min_tokens: int = 0
    ignore_eos: bool = False
    stop_token_ids: list[int] | None = None
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    # Structured outputs (router.structured_request): OpenAI's response_format, vLLM's structured_outputs
    # and guided_* extensions.
    response_format: dict | None = None
    structured_outputs: dict | None = None
    guided_json: Any = None
    guided_regex: str | None = None
    guided_choice: list | None = None
    guided_grammar: str | None = None
    # Tool calling (router.tool_calls), on chat completions.
    tools: list | None = Field(None, max_length=MAX_TOOLS)
    tool_choice: str | dict | None = None
    # vLLM's: each prompt token's logprob and this many alternatives (router.prompt_echo), on completions.
    prompt_logprobs: int | None = None
    # vLLM's: the tenant's prefix-cache salt (wire.cache_salt); only requests of the same salt share cached
    # blocks. A string (pydantic refuses a number: no coercion to str) of bounded length, else a 400 naming it.
    cache_salt: str | None = Field(None, min_length=1, max_length=MAX_CACHE_SALT_CHARS)  # "": a 400, as vLLM's
    # Not honoured: refused unless neutral (see the module docstring).
    functions: list | None = None
    function_call: str | dict | None = None


def prompt_kind(value: Any) -> str | None:
    """Which form of `prompt` a value is, from its first element: only that form is validated (pydantic's
    union would try each, and a list fails one element at a time: 1M ids cost 177 ms instead of 17)."""
    if isinstance(value, str):
        return "text"
    if isinstance(value, list) and value:
        return {str: "texts", list: "id_lists"}.get(type(value[0]), "ids")
    return "ids" if isinstance(value, list) else None  # [] fails as ids (min length); None: a clear error


Prompt = Annotated[
    Union[Annotated[str, Tag("text")], Annotated[list[str], Tag("texts")], Annotated[list[int], Tag("ids")],
          Annotated[list[list[int]], Tag("id_lists")]],
    Discriminator(prompt_kind, custom_error_type="invalid_prompt",
                  custom_error_message="prompt must be a string, a list of strings, token ids, or lists of token ids"),
]  # fmt: skip


class CompletionRequest(_GenerationFields):
    prompt: Prompt
    max_tokens: int | None = Field(16, ge=1)
    logprobs: int | None = None
    echo: bool = False
    best_of: int | None = None
    suffix: str | None = None


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: str
    content: str | list[dict] | None = None


class ChatCompletionRequest(_GenerationFields):
    # Bounded here, where pydantic stops at the bound (100k messages: 7 ms) instead of validating each (150 ms);
    # the served model refuses more messages than its context has tokens (router.served_model).
    messages: list[ChatMessage] = Field(min_length=1, max_length=MAX_MESSAGES)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = None
    parallel_tool_calls: bool = True  # False: at most one tool call per choice


# ---- responses --------------------------------------------------------------


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class CompletionLogprobs(BaseModel):
    tokens: list[str]
    token_logprobs: list[float]
    top_logprobs: list[dict[str, float]] | None
    text_offset: list[int]


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: str | None


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int]


class ChatTokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob]


class ChatLogprobs(BaseModel):
    content: list[ChatTokenLogprob]


class FunctionCall(BaseModel):
    name: str
    arguments: str  # JSON text


class ToolCall(BaseModel):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatResponseMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None
    tool_calls: list[ToolCall] = Field(default_factory=list)


class ChatChoice(BaseModel):
    index: int
    message: ChatResponseMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage
    phases: list[dict[str, float]] = []  # each choice's, in order: where its time went (router.phases)


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "tandem"
    max_model_len: int


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    error: ErrorDetail
