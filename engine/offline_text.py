"""The offline frontend's text: `LLM.generate` turns the engine core's token ids into text here.

The engine core stops a request on EOS, stop token ids, max_tokens and
min_tokens only; its text, stop strings, `include_stop_str_in_output` and
`skip_special_tokens` are `output_text.TextStream`'s, exactly as in the router.
A stop string ends the request here: its output is finished with reason "stop",
the stop string, and the tokens up to the one that completed it; `LLM` then
aborts it in the engine. One `OfflineText` per `generate` call.
"""

from __future__ import annotations

from dataclasses import replace

from engine.outputs import RequestOutput
from engine.sampling_params import SamplingParams
from output_text import TextOptions, TextStream


class OfflineText:
    def __init__(self, tokenizer):
        self._tokenizer = tokenizer  # None: the LLM was made with skip_tokenizer_init, outputs have no text
        self._streams: dict[str, TextStream] = {}

    def open(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams) -> None:
        """Start a request's text; raises ValueError for stop strings without a tokenizer."""
        if self._tokenizer is None:
            if params.stop:
                raise ValueError("stop strings need a tokenizer: this LLM was made with skip_tokenizer_init")
            return
        options = TextOptions(params.stop, params.include_stop_str_in_output, params.skip_special_tokens,
                              params.min_tokens)  # fmt: skip
        self._streams[request_id] = TextStream(self._tokenizer, prompt_token_ids, options)

    def advance(self, out: RequestOutput) -> RequestOutput:
        """`out` with its text once it is finished, by the engine or by a stop string; unfinished, `out` itself."""
        stream = self._streams.get(out.request_id)
        if stream is None:
            return out
        stream.add(out.new_token_ids)
        if not (out.finished or stream.stopped):
            return out
        del self._streams[out.request_id]
        stream.finish()
        completion = replace(out.outputs[0], text=stream.text)
        if stream.stopped:
            # A step adds one token per request: the one that completed the stop string is the last.
            completion = replace(completion, finish_reason="stop", stop_reason=stream.stop_reason)
        return replace(out, outputs=[completion], finished=True)
