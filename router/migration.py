"""Request migration: the request a failed attempt leaves to the next one.

When a worker dies while it holds a request (decode at any time; prefill
until its KV has landed on decode), the router resumes the request on live workers: the
new attempt's prompt is the original prompt followed by every token already
handed to the client, it may produce only the tokens still allowed, and its
output is spliced after those tokens (`router.token_stream.RequestOutputs.restart`),
so the client sees no duplicate and no gap.

What a resumed request reproduces:
- Greedy decoding (temperature 0): the same tokens as an uninterrupted run
  (the resumed prompt's KV is computed again, equal within float tolerance).
- max_tokens, min_tokens and stop token ids: counted over the whole output
  (the new attempt gets what is left of each).
- Text and stop strings: the router's alone (`router.choice_output`), made
  from the one token stream of the whole output, so the splice is invisible
  to them; no worker sees a stop string.
- usage: the prompt and completion counts of the whole request.
What it does not:
- Seeded sampling restarts its random generator at the seed with the new
  attempt, so tokens after the splice are reproducible (the same failure
  point gives the same output) but differ from an uninterrupted run's.
  Unseeded sampling is random either way.
- Presence, frequency and repetition penalties count the tokens before the
  splice as prompt tokens: repetition penalty treats them alike, presence and
  frequency penalties no longer see them.
- logprobs of tokens before the splice are those already sent.
- Structured output: the grammar continues after the tokens before the splice
  (`resumed_output_tokens`), so the whole output still matches it.
"""

from __future__ import annotations

from wire.requests import GenerateRequest


def resumed_request(original: GenerateRequest, delivered: list[int], attempt: int,
                    suspect: bool = False) -> GenerateRequest | None:  # fmt: skip
    """The request that continues `original` after `delivered` tokens; None if no token is left to make.
    `suspect`: a step failed with it alone before (`GenerateRequest.suspect`)."""
    sampling = original.sampling.continued(len(delivered))
    if sampling is None:
        return None
    return GenerateRequest(f"{original.request_id}.{attempt}", original.prompt_token_ids + tuple(delivered), sampling,
                           original.stream_address, suspect=suspect)  # fmt: skip
