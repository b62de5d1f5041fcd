"""vLLM's small endpoints beside the OpenAI API: POST /tokenize, POST /detokenize, GET /version.

The shapes are vLLM's, so its clients and `vllm bench serve` work unchanged:

    POST /tokenize    {"prompt": "..."} or {"messages": [...]}  ->  {"count", "max_model_len", "tokens", "token_strs"}
    POST /detokenize  {"tokens": [ids]}                           ->  {"prompt": "..."}
    GET  /version                                                 ->  {"version": "0.1.0"}

Tokens are counted the way the completions and chat endpoints count a prompt (`ServedModel`): a text
prompt with the tokenizer's special tokens unless `add_special_tokens` is false; messages through the
chat template, with the assistant's turn opened unless `add_generation_prompt` is false. The same bounds
hold (what cannot fit the context is refused before any work), a long input is tokenized on a thread (the
event loop serves every other request meanwhile), and the API key guards both as it guards /v1/*.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

from fastapi import FastAPI
from pydantic import BaseModel, ConfigDict, Field, model_validator

from router.api_models import MAX_MESSAGES, ChatMessage
from router.openai_common import check_model
from router.served_model import ServedModel


class TokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = Field(None, min_length=1, max_length=MAX_MESSAGES)
    add_special_tokens: bool | None = None  # default: True for a prompt, False for messages (the template has them)
    add_generation_prompt: bool = True
    return_token_strs: bool = False

    @model_validator(mode="after")
    def _one_input(self) -> "TokenizeRequest":
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("give either prompt or messages")
        return self


class TokenizeResponse(BaseModel):
    count: int
    max_model_len: int
    tokens: list[int]
    token_strs: list[str] | None = None


class DetokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str | None = None
    tokens: list[int]


def install_tokenize_routes(app: FastAPI, model: ServedModel) -> None:
    @app.post("/tokenize", response_model=TokenizeResponse)
    async def tokenize(body: TokenizeRequest):
        if body.model is not None:  # optional here, as in vLLM
            check_model(body.model, model.name)
        if body.prompt is not None:  # bounded and, when long, tokenized off the event loop, as a completion's
            tokens = await model.encode_async(body.prompt, add_special_tokens=body.add_special_tokens is not False)
        else:
            messages = [m.model_dump(exclude_none=True) for m in body.messages]
            tokens = await model.encode_chat_async(messages, add_generation_prompt=body.add_generation_prompt,
                                                   add_special_tokens=bool(body.add_special_tokens))  # fmt: skip
        strs = model.tokenizer.convert_ids_to_tokens(tokens) if body.return_token_strs else None
        return TokenizeResponse(count=len(tokens), max_model_len=model.max_model_len, tokens=tokens, token_strs=strs)

    @app.post("/detokenize")
    async def detokenize(body: DetokenizeRequest):
        if body.model is not None:
            check_model(body.model, model.name)
        return {"prompt": await model.decode_async(body.tokens)}

    @app.get("/version")
    async def server_version():
        try:
            return {"version": version("tandem")}
        except PackageNotFoundError:  # run from a checkout that was never installed
            return {"version": "unknown"}
