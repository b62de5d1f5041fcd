"""One sequence's output text: decoded token by token, cut at its first stop string, as OpenAI defines it.

    stream = TextStream(tokenizer, prompt_ids, TextOptions(stop=("\\n",)))
    piece = stream.add(token_ids)      text that may be shown now (a possible stop string's start held back)
    stream.stopped, stream.num_tokens  a stop string matched; tokens taken, up to the one that completed it
    rest = stream.finish()             the sequence ended: the rest, exact (every output id decoded once more)

Whoever answers the client owns one per sequence: the router (`router.choice_output`) for every HTTP
request, across every attempt of a resumed one; `engine.llm.LLM` offline. Once a stop string matched,
the owner ends the sequence (on its workers, or in its engine) and reports finish_reason "stop" with
`num_tokens` tokens; further tokens are not taken.

The text is cut before the stop string (kept with `include_stop_str_in_output`); stop strings count
only in text made after `min_tokens` tokens, as vLLM does. While no stop string matched, the final text
equals `tokenizer.decode(output ids, skip_special_tokens=...)` (for byte-level BPE tokenizers; a
SentencePiece tokenizer may differ in the leading space the prompt context implies).
"""

from __future__ import annotations

from dataclasses import dataclass

from output_text.incremental import IncrementalDecoder
from output_text.stop_strings import StopStrings


@dataclass(frozen=True)
class TextOptions:
    """What shapes a sequence's text, by OpenAI's and vLLM's names; only its text's owner reads them."""

    stop: tuple[str, ...] = ()
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    min_tokens: int = 0  # the whole sequence's, however many attempts it takes


class TextStream:
    def __init__(self, tokenizer, prompt_ids, options: TextOptions = TextOptions()):
        self._decoder = IncrementalDecoder(tokenizer, prompt_ids, options.skip_special_tokens)
        self._stops = StopStrings(options.stop)
        self._include_stop, self._min_tokens = options.include_stop_str_in_output, options.min_tokens
        self._token_ids: list[int] = []
        self._floor = 0  # stop strings may start only here or later: text made after min_tokens tokens
        self.text = ""  # decoded so far, cut at a matched stop string
        self.sent = 0  # characters of `text` handed out
        self.stop_reason: str | None = None  # the stop string that matched

    @property
    def stopped(self) -> bool:
        return self.stop_reason is not None

    @property
    def num_tokens(self) -> int:
        """Tokens taken: all so far, or up to and including the one that completed a stop string."""
        return len(self._token_ids)

    def add(self, token_ids) -> str:
        """Take tokens (none after a stop string); return the text that may be shown now."""
        for token in token_ids:
            if self.stopped:
                break
            self._token_ids.append(token)
            piece = self._decoder.step(token)
            if len(self._token_ids) <= self._min_tokens:
                self.text += piece
                self._floor = len(self.text)
            elif piece:
                self._append(piece)
        return self._emit(len(self.text) - self._held_back())

    def finish(self) -> str:
        """The sequence ended: the text not shown yet, its tail decoded exactly (a split last character too)."""
        if not self.stopped:
            full = self._decoder.full_text(self._token_ids)
            if full.startswith(self.text[: self.sent]):  # never contradict text already shown
                self.text = ""
                self._append(full)  # the same stop search, over the exact text
        return self._emit(len(self.text))

    def _append(self, piece: str) -> None:
        searched = len(self.text)
        self.text += piece
        match = self._stops.first_match(self.text, searched, self._floor) if self._stops.stops else None
        if match is not None:
            index, stop = match
            self.text = self.text[: index + len(stop) if self._include_stop else index]
            self.stop_reason = stop

    def _held_back(self) -> int:
        """Characters at the end not shown yet: they may begin a stop string, which the client never sees."""
        if self.stopped or self._include_stop or not self._stops.stops:
            return 0
        return self._stops.partial_tail(self.text, self._floor)

    def _emit(self, end: int) -> str:
        if end <= self.sent:
            return ""
        out, self.sent = self.text[self.sent : end], end
        return out
