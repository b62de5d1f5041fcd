"""What the router knows of the model it serves: its name, context length, tokenizer and chat template.

Tokenization happens here, in the router (routing works on token ids; workers
receive ids, never text), and so does detokenization (`text_stream`). Loaded
once at startup; read-only afterwards.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Iterable

from output_text import TextOptions, TextStream
from router.config import RouterConfig
from router.errors import bad_request


# Texts at least this long are tokenized on a thread (about 5 ms of the event loop for shorter ones).
OFF_LOOP_CHARS = 16_384
# Chats of at least this many messages are rendered on a thread (jinja is Python: the loop gets the GIL back
# every switch interval; ~4 ms of rendering on the loop below it).
OFF_LOOP_MESSAGES = 256
# Token texts rendered on a thread from this many ids on (logprobs: tokens times alternatives; 4,096 took
# 1.5 ms in one batched call, 15 ms as one decode each).
OFF_LOOP_TOKEN_TEXTS = 4096


class ServedModel:
    def __init__(self, config: RouterConfig):
        from transformers import AutoTokenizer

        self.name = config.model_name
        self.tokenizer = AutoTokenizer.from_pretrained(config.model_dir)
        # The Rust tokenizer itself: transformers' __call__ wraps it in ~10x its cost for one string.
        self._backend = self.tokenizer.backend_tokenizer
        # What `tokenizer.decode` does after the Rust decode (transformers skips the clean-up for BPE models
        # unless told to corrupt): `token_texts` decodes through the Rust tokenizer and must give the same text.
        forced = "clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output"
        bpe = type(self._backend.model).__name__ == "BPE"
        self._cleans_up_decoded = bool(self.tokenizer.clean_up_tokenization_spaces) and (
            not bpe or bool(getattr(self.tokenizer, forced, False)))
        self.vocab_size = len(self.tokenizer)
        self.max_model_len = config.max_model_len or _context_length(config.model_dir)
        self._chat_template = config.chat_template
        # No token covers more characters than the vocabulary's longest: a text longer than max_model_len of
        # those cannot fit the context, and is refused before it is tokenized (6 MB took 1.9 s to tokenize).
        self.max_prompt_chars = self.max_model_len * max(map(len, self.tokenizer.get_vocab()), default=1)
        self.tool_call_parser = config.tool_call_parser  # the model family's tool-call format

    def encode(self, text: str, add_special_tokens: bool = True, param: str = "prompt") -> list[int]:
        """The ids `tokenizer(text)["input_ids"]` gives, straight from the Rust tokenizer; 400 for text it
        cannot take (a lone surrogate such as "\\ud800", which JSON can carry and UTF-8 cannot)."""
        try:
            if len(text) < OFF_LOOP_CHARS:
                return self._backend.encode(text, add_special_tokens=add_special_tokens).ids
            # The same ids; encode_batch lets go of the GIL while it works (encode does not), so a long text
            # tokenized on a thread leaves the event loop free.
            return self._backend.encode_batch([text], add_special_tokens=add_special_tokens)[0].ids
        except TypeError:  # the tokenizer's words for a str that is not valid Unicode
            raise bad_request("the text is not valid Unicode (a lone surrogate?)", param) from None

    def encode_chat(self, messages: list[dict], add_generation_prompt: bool = True,
                    add_special_tokens: bool = False, tools: list[dict] | None = None) -> list[int]:  # fmt: skip
        """The chat template applied (with the assistant's turn opened, and the `tools` it may call), then
        tokenized like the text it makes (the template writes the special tokens itself)."""
        template = self._chat_template or getattr(self.tokenizer, "chat_template", None)
        if not template:
            raise bad_request(f"model {self.name} has no chat template; use /v1/completions", "messages")
        try:
            text = self.tokenizer.apply_chat_template(messages, chat_template=template, tokenize=False,
                                                      add_generation_prompt=add_generation_prompt, tools=tools or None)
        except Exception as err:  # jinja raises its own types for messages a template rejects
            raise bad_request(f"the chat template rejected the messages: {err}", "messages") from None
        return self.encode(text, add_special_tokens=add_special_tokens, param="messages")

    async def encode_async(self, text: str, param: str = "prompt", add_special_tokens: bool = True) -> list[int]:
        """`encode`, refused first if the text cannot fit the context, and on a thread when it is long (the
        router's event loop keeps serving every other request meanwhile)."""
        self.check_text_length(len(text), param)
        if len(text) < OFF_LOOP_CHARS:
            return self.encode(text, add_special_tokens, param)
        return await asyncio.to_thread(self.encode, text, add_special_tokens, param)

    async def encode_chat_async(self, messages: list[dict], tools: list[dict] | None = None,
                                add_generation_prompt: bool = True, add_special_tokens: bool = False) -> list[int]:
        """`encode_chat` with `encode_async`'s bound and thread; the tools count as text (the template writes
        their schemas into the prompt)."""
        if len(messages) > self.max_model_len:  # every message renders to a token or more (measured: 100k
            # one-letter messages took 1.6 s of jinja)
            raise bad_request(f"{len(messages)} messages cannot fit this model's maximum context length of "
                              f"{self.max_model_len} tokens", "messages")  # fmt: skip
        chars = sum(len(str(m.get("content") or "")) for m in messages) + (len(json.dumps(tools)) if tools else 0)
        self.check_text_length(chars, "messages")
        args = (messages, add_generation_prompt, add_special_tokens, tools)
        if chars < OFF_LOOP_CHARS and len(messages) < OFF_LOOP_MESSAGES:
            return self.encode_chat(*args)
        return await asyncio.to_thread(self.encode_chat, *args)

    async def decode_async(self, token_ids: list[int], param: str = "tokens") -> str:
        """The text of ids in the vocabulary, at most a context's worth (a longer list is no text this model
        makes), decoded on a thread when long."""
        if len(token_ids) > self.max_model_len:
            raise bad_request(f"at most {self.max_model_len} token ids (the maximum context length), got "
                              f"{len(token_ids)}", param)  # fmt: skip
        self.check_in_vocab(token_ids, "token ids", param)
        if len(token_ids) < OFF_LOOP_CHARS // 4:
            return self.tokenizer.decode(token_ids)
        return await asyncio.to_thread(self.tokenizer.decode, token_ids)

    def check_text_length(self, chars: int, param: str) -> None:
        if chars > self.max_prompt_chars:
            raise bad_request(f"a text of {chars} characters cannot fit this model's maximum context length of "
                              f"{self.max_model_len} tokens", param)  # fmt: skip

    def check_ids(self, token_ids: list[int], param: str = "prompt") -> None:
        if not token_ids:
            raise bad_request("the prompt is empty", param)
        if len(token_ids) >= self.max_model_len:  # before the scan: a huge list is refused for its length alone
            self.max_tokens_for(len(token_ids), None)
        self.check_in_vocab(token_ids, "prompt token ids", param)

    def check_in_vocab(self, token_ids: list[int], what: str, param: str) -> None:
        if any(not 0 <= t < self.vocab_size for t in token_ids):
            raise bad_request(f"{what} must be in [0, {self.vocab_size})", param)

    def max_tokens_for(self, prompt_len: int, asked: int | None, param: str = "max_tokens") -> int:
        """Output tokens allowed: `asked`, or all the context the prompt leaves; 400 when that does not fit."""
        room = self.max_model_len - prompt_len
        if room <= 0:
            raise bad_request(f"this model's maximum context length is {self.max_model_len} tokens; the prompt has "
                              f"{prompt_len}", "messages" if param == "max_completion_tokens" else "prompt")
        if asked is not None and asked > room:
            raise bad_request(f"{param}={asked} plus the prompt's {prompt_len} tokens exceeds the maximum context "
                              f"length {self.max_model_len}; ask for at most {room}", param)  # fmt: skip
        return asked if asked is not None else room

    def text_stream(self, prompt_ids: list[int], options: TextOptions) -> TextStream:
        """A sequence's output text: the router owns it (workers see token ids only)."""
        return TextStream(self.tokenizer, prompt_ids, options)

    def token_texts(self, token_ids: Iterable[int]) -> dict[int, str]:
        """Each distinct token's text as logprobs show it: `tokenizer.decode([id])`, or its vocabulary form when
        alone it is part of a character (else several read "\ufffd"). Two tokenizer calls for all of them: a
        call per token and alternative held the event loop for seconds."""
        ids = list(dict.fromkeys(token_ids))
        texts = self._backend.decode_batch([[t] for t in ids], skip_special_tokens=False)
        if self._cleans_up_decoded:
            texts = [self.tokenizer.clean_up_tokenization(text) for text in texts]
        partial = [i for i, text in enumerate(texts) if "\ufffd" in text]
        for i, token in zip(partial, self.tokenizer.convert_ids_to_tokens([ids[i] for i in partial])):
            texts[i] = token
        return dict(zip(ids, texts))

    async def token_texts_async(self, token_ids: Iterable[int]) -> dict[int, str]:
        """`token_texts`, on a thread when there are many (a long echoed prompt's alternatives: the rendering is
        proportional to the client's input)."""
        ids = list(token_ids)
        if len(ids) < OFF_LOOP_TOKEN_TEXTS:
            return self.token_texts(ids)
        return await asyncio.to_thread(self.token_texts, ids)


def _context_length(model_dir: str) -> int:
    config = json.loads((Path(model_dir) / "config.json").read_text())
    for key in ("max_position_embeddings", "n_positions", "max_seq_len"):
        if isinstance(config.get(key), int):
            return config[key]
    raise ValueError(f"{model_dir}/config.json names no context length; set RouterConfig.max_model_len")
