"""One sequence's output text in the router, token by token, cut where the engine stops.

The engine stops a request at the token that completes a stop string and
reports `finish_reason="stop"`, but sends only token ids; the router makes the
same text from them: the tokenizer's incremental decoder (`DecodeStream`, the
prompt's last tokens as context) for the streamed pieces, the first stop
string cut off (kept with `include_stop_str_in_output`), and text that could
still become a stop string held back until the next token or the end. At the
end the whole output is decoded once more, so the final text equals
`tokenizer.decode(output ids)` cut at the stop string, including a trailing
incomplete character (U+FFFD) that no incremental step could emit.
"""

from __future__ import annotations

from tokenizers.decoders import DecodeStream

_PROMPT_CONTEXT_TOKENS = 6


class TextStream:
    def __init__(self, tokenizer, prompt_ids, stop: tuple[str, ...] = (), include_stop: bool = False,
                 skip_special_tokens: bool = True, min_tokens: int = 0):  # fmt: skip
        self._tokenizer = tokenizer  # a transformers fast tokenizer
        self._decoder = DecodeStream(ids=_clean_context(tokenizer, prompt_ids), skip_special_tokens=skip_special_tokens)
        self._skip_special = skip_special_tokens
        self._stops, self._include_stop, self._min_tokens = stop, include_stop, min_tokens
        self._token_ids: list[int] = []
        self._stop_floor = 0  # stop strings count only from here (text made after min_tokens tokens)
        self.text = ""  # decoded so far, cut at a matched stop string
        self.sent = 0  # characters of `text` handed out
        self.stopped = False

    @property
    def num_tokens(self) -> int:
        """Tokens taken in: up to and including the one that completed a stop string."""
        return len(self._token_ids)

    def add(self, token_ids: list[int]) -> str:
        """Append tokens; return the text that may be streamed now."""
        for token in token_ids:
            if self.stopped:
                break
            self._token_ids.append(token)
            piece = self._decoder.step(self._tokenizer.backend_tokenizer, token)
            if len(self._token_ids) <= self._min_tokens:
                self.text += piece or ""
                self._stop_floor = len(self.text)
            elif piece:
                self._append(piece)
        return self._emit(len(self.text) - self._holdback())

    def finish(self) -> str:
        """The sequence ended: return the rest of the text, with the exact decode of every output token."""
        if not self.stopped:
            full = self._tokenizer.decode(self._token_ids, skip_special_tokens=self._skip_special)
            if full.startswith(self.text[: self.sent]):
                self.text = ""
                self._append(full)  # the same stop search over the authoritative text
        return self._emit(len(self.text))

    def _append(self, piece: str) -> None:
        start = max(self._stop_floor, len(self.text) - max((len(s) for s in self._stops), default=0) + 1)
        self.text += piece
        hits = [(i, s) for s in self._stops if (i := self.text.find(s, start)) != -1]
        if hits:
            index, stop = min(hits)
            self.text = self.text[: index + len(stop) if self._include_stop else index]
            self.stopped = True

    def _holdback(self) -> int:
        """Length of the longest tail that may begin a stop string (never shown before it is decided)."""
        if self.stopped or self._include_stop:
            return 0
        for length in range(min(max((len(s) for s in self._stops), default=1) - 1, len(self.text)), 0, -1):
            if any(s.startswith(self.text[-length:]) for s in self._stops):
                return length
        return 0

    def _emit(self, end: int) -> str:
        if end <= self.sent:
            return ""
        out, self.sent = self.text[self.sent : end], end
        return out


def _clean_context(tokenizer, prompt_ids) -> list[int]:
    """The prompt's last tokens, short of any that end inside a character (the decoder would re-emit the prompt)."""
    context = list(prompt_ids[-_PROMPT_CONTEXT_TOKENS:])
    while context and tokenizer.decode(context).endswith("\ufffd"):
        context.pop()
    return context
