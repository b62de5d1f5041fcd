"""The TokenDeltas a decode worker streams: engine outputs, and the last word of a request that ends early.

Numbering is the whole request's, as the client sees it: after a local
recompute that continues past an already-streamed first token (`DecodeRecord.spliced`),
the engine counts that token as prompt, and its outputs are shifted back (`TokenDelta.shifted`).
"""

from __future__ import annotations

from decode_worker.records import DecodeRecord
from engine.outputs import RequestOutput
from runtime.engine_bridge import prompt_token_logprobs, token_logprobs
from wire.requests import TokenDelta


def output_delta(out: RequestOutput, already_streamed: int = 0) -> TokenDelta | None:
    """The delta of an engine output, minus its first `already_streamed` new tokens; None if nothing to say."""
    completion = out.outputs[0]
    new = out.new_token_ids[already_streamed:]
    if not new and not out.finished:
        return None
    first_index = len(completion.token_ids) - len(new)
    # The prompt's logprobs go with the first output token (none when prefill streamed that token).
    prompt = prompt_token_logprobs(out.prompt_logprobs) if first_index == 0 and new else ()
    return TokenDelta(out.request_id, first_index, tuple(new), out.finished, completion.finish_reason,
                      len(out.prompt_token_ids), len(completion.token_ids), out.num_cached_tokens,
                      logprobs=token_logprobs(completion.logprobs, len(new)), prompt_logprobs=prompt)  # fmt: skip


def final_delta(record: DecodeRecord, finish_reason: str = "abort", error: str = "", resumable: bool = False
                ) -> TokenDelta:  # fmt: skip
    """The last delta of a request that ends here without an engine output (an error, nothing left to make,
    or `resumable`: given up by this worker, for the router to resume elsewhere)."""
    n = record.num_output
    return TokenDelta(record.request_id, n, (), True, finish_reason, record.num_prompt_tokens, n, error=error,
                      resumable=resumable)  # fmt: skip
