"""Token ids to text, one token at a time: the tokenizer's own incremental decoder, the prompt as context.

Decoding token by token is wrong for most tokenizers: a byte-level BPE token may hold half of a UTF-8
character, and SentencePiece decoders add or strip spaces by what comes before. The `tokenizers`
library's `DecodeStream` keeps a small window of recent ids and emits only complete text, at a constant
cost per token (one call into Rust: the router runs it for every token it serves). It starts from the
prompt's last tokens, so the first output token decodes as it does after them. A step never emits a
trailing incomplete character; `full_text` decodes every id once at the end, as `tokenizer.decode` does
(U+FFFD for stray bytes). Owned by `output_text.stream.TextStream`, one per sequence.
"""

from __future__ import annotations

from tokenizers.decoders import DecodeStream

# Prompt tokens decoded as left context for the first output tokens.
_PROMPT_CONTEXT_TOKENS = 6


class IncrementalDecoder:
    def __init__(self, tokenizer, prompt_ids, skip_special_tokens: bool):
        backend = getattr(tokenizer, "backend_tokenizer", None)  # the Rust tokenizer inside transformers'
        if backend is None:
            raise ValueError(f"output text needs a fast (Rust) tokenizer, got {type(tokenizer).__name__}")
        self._tokenizer, self._backend, self._skip_special = tokenizer, backend, skip_special_tokens
        self._stream = DecodeStream(ids=_context(tokenizer, prompt_ids), skip_special_tokens=skip_special_tokens)

    def step(self, token_id: int) -> str:
        """The text `token_id` completes ("" while a character is still split)."""
        return self._stream.step(self._backend, token_id) or ""

    def full_text(self, token_ids: list[int]) -> str:
        return self._tokenizer.decode(token_ids, skip_special_tokens=self._skip_special)


def _context(tokenizer, prompt_ids) -> list[int]:
    """The prompt's last tokens, short of any that end inside a character (the decoder would re-emit them)."""
    context = list(prompt_ids[-_PROMPT_CONTEXT_TOKENS:])
    while context and tokenizer.decode(context).endswith("\ufffd"):
        context.pop()
    return context
