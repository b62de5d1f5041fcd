"""Incremental detokenization of one request's output, with stop strings.

Decoding token by token is wrong for most tokenizers: a byte-level BPE
token may hold half of a UTF-8 character, and SentencePiece decoders strip
or add spaces depending on what comes before. So each step decodes a small
window of recent tokens twice, once without and once with the new token,
and emits the difference (the prefix-offset / read-offset technique):

    tokens:  ... [prefix_offset ... read_offset) [read_offset ... end)
                  already emitted, kept as        not yet emitted
                  decoding context

The window only moves forward once its text is complete (does not end in
U+FFFD), so the cost per token is constant, never a re-decode of the whole
output.
"""

from __future__ import annotations

from engine.sampling_params import SamplingParams

# Prompt tokens decoded as left context for the first output tokens.
_PROMPT_CONTEXT_TOKENS = 6
_REPLACEMENT_CHAR = "\ufffd"


class IncrementalDetokenizer:
    """Turns one request's output tokens into streamed text deltas.

    `tokenizer` is a Hugging Face tokenizer (needs `convert_ids_to_tokens`
    and `convert_tokens_to_string`). Stop strings from `params.stop` end the
    text: afterwards `finished` is True, `stop_reason` is the matched string
    and further tokens are ignored. While no stop matched, the final
    `output_text` equals `tokenizer.decode(output_ids, skip_special_tokens=...)`
    once `flush()` has been called (for byte-level BPE tokenizers; a
    SentencePiece tokenizer keeps the leading space that the prompt context
    implies, as vLLM does).
    """

    def __init__(self, tokenizer, prompt_token_ids: list[int], params: SamplingParams) -> None:
        self._tokenizer = tokenizer
        self._skip_special = params.skip_special_tokens
        self._stops = params.stop
        self._max_stop_len = max((len(s) for s in self._stops), default=0)
        self._include_stop = params.include_stop_str_in_output
        self._min_tokens = params.min_tokens

        context = list(prompt_token_ids[-_PROMPT_CONTEXT_TOKENS:])
        self._tokens: list[str] = self._to_tokens(context)
        self._prefix_offset = 0
        self._read_offset = len(self._tokens)

        self._text = ""
        self._emitted = 0  # characters of _text already returned to the caller
        self._num_output_tokens = 0
        self._stop_floor = 0  # stop strings may only start at or after this index
        self.stop_reason: str | None = None

    @property
    def output_text(self) -> str:
        """All decoded text so far, truncated at a matched stop string.

        Includes text held back from the deltas; excludes trailing bytes of
        an incomplete UTF-8 character until more tokens or `flush()` come.
        """
        return self._text

    @property
    def finished(self) -> bool:
        """True once a stop string matched."""
        return self.stop_reason is not None

    def append(self, token_id: int) -> str:
        """Add one generated token; return the text that may be streamed now."""
        if self.finished:
            return ""
        self._num_output_tokens += 1
        self._tokens.extend(self._to_tokens([token_id]))
        return self._consume(self._decode_window(final=False), final=False)

    def flush(self) -> str:
        """Return all text not yet streamed, for a request ending without a stop string.

        Pending bytes of an incomplete character are decoded as U+FFFD, the
        same as a full `tokenizer.decode` would.
        """
        if self.finished:
            return ""
        return self._consume(self._decode_window(final=True), final=True)

    def _to_tokens(self, token_ids: list[int]) -> list[str]:
        return self._tokenizer.convert_ids_to_tokens(
            token_ids, skip_special_tokens=self._skip_special
        )

    def _decode_window(self, final: bool) -> str:
        """Text added by the tokens past read_offset; "" while it is incomplete."""
        decode = self._tokenizer.convert_tokens_to_string
        prefix_text = decode(self._tokens[self._prefix_offset : self._read_offset])
        new_text = decode(self._tokens[self._prefix_offset :])
        if len(new_text) <= len(prefix_text):
            return ""
        if new_text.endswith(_REPLACEMENT_CHAR) and not final:
            return ""  # a multi-byte character is split; wait for its remaining bytes
        # Forget tokens that can no longer be decoding context, so memory stays bounded.
        del self._tokens[: self._read_offset]
        self._prefix_offset, self._read_offset = 0, len(self._tokens)
        return new_text[len(prefix_text) :]

    def _consume(self, delta: str, final: bool) -> str:
        """Append delta, apply stop strings, and return what may be streamed."""
        self._text += delta
        if self._stops and delta:
            self._check_stop(len(delta))
        end = len(self._text)
        if not (final or self.finished):
            end -= self._holdback_len()
        if end <= self._emitted:
            return ""
        out = self._text[self._emitted : end]
        self._emitted = end
        return out

    def _check_stop(self, delta_len: int) -> None:
        # Like vLLM, stop strings count only once more than min_tokens tokens
        # exist, and never match text produced before that.
        if self._num_output_tokens <= self._min_tokens:
            self._stop_floor = len(self._text)
            return
        # Only a match overlapping the new delta can be new.
        start = max(self._stop_floor, len(self._text) - delta_len - self._max_stop_len + 1)
        best: tuple[int, str] | None = None
        for stop in self._stops:
            index = self._text.find(stop, start)
            if index != -1 and (best is None or index < best[0]):
                best = (index, stop)
        if best is None:
            return
        index, stop = best
        cut = index + len(stop) if self._include_stop else index
        self._text = self._text[:cut]
        self._emitted = min(self._emitted, cut)
        self.stop_reason = stop

    def _holdback_len(self) -> int:
        """Length of the longest text suffix that could begin a stop string.

        Streaming it now could show the client part of a stop string that
        is then cut from the final text.
        """
        if self._include_stop or not self._stops:
            return 0
        longest = min(self._max_stop_len - 1, len(self._text) - self._stop_floor)
        for length in range(longest, 0, -1):
            suffix = self._text[-length:]
            if any(stop.startswith(suffix) for stop in self._stops):
                return length
        return 0
