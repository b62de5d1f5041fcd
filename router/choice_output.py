"""One choice's output as the client gets it: the text of its tokens, its stop strings, its end.

Workers stream token ids only; the router alone makes text of them (`output_text.TextStream`, one per
choice) and decides stop strings, on the whole output of the choice: a resumed request's tokens simply
continue the stream (`router.token_stream`), so a stop string straddling a resume is like any other.

A stop string ends the choice here, as vLLM's output processor does: its update carries the tokens (and
logprobs) up to the one that completed it and a final delta made by the router (finish_reason "stop",
usage counting the tokens sent); its owner (`router.serving`) then aborts the request on its workers.
Otherwise the choice ends with its worker's final delta (EOS, stop token id, length, abort).
"""

from __future__ import annotations

from dataclasses import dataclass

from output_text import TextStream
from router.token_stream import OutputChunk
from wire.requests import GenerateRequest, TokenDelta, TokenLogprob


@dataclass
class ChoiceUpdate:
    index: int
    text: str
    token_ids: list[int]
    logprobs: list[TokenLogprob]
    final: TokenDelta | None = None  # set on the choice's last update
    prompt_logprobs: tuple[TokenLogprob | None, ...] = ()  # once, when the request asked for them

    @property
    def finish_reason(self) -> str | None:
        return self.final.finish_reason if self.final is not None else None


class ChoiceOutput:
    def __init__(self, index: int, request: GenerateRequest, text: TextStream):
        self.index = index
        self._request = request  # as the client asked it: its id and prompt are the whole request's
        self.text = text

    def update(self, chunk: OutputChunk) -> ChoiceUpdate:
        """The client's update for the next chunk of tokens; `final` set once the choice has ended."""
        before = self.text.num_tokens
        piece = self.text.add(chunk.token_ids)
        if chunk.final is not None or self.text.stopped:
            piece += self.text.finish()  # may itself find the stop string, in the exact text
        taken = self.text.num_tokens - before  # tokens past a stop string are never sent
        final = self._stopped(chunk) if self.text.stopped else chunk.final
        return ChoiceUpdate(self.index, piece, chunk.token_ids[:taken], chunk.logprobs[:taken], final,
                            chunk.prompt_logprobs)  # fmt: skip

    def _stopped(self, chunk: OutputChunk) -> TokenDelta:
        n = self.text.num_tokens
        prompt = len(self._request.prompt_token_ids)
        return TokenDelta(self._request.request_id, n, (), True, "stop", prompt, n, chunk.num_cached_tokens)
