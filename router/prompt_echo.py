"""The prompt in a completion's answer: `echo` (the prompt's text before the completion's, and with
`logprobs` its tokens' logprobs before the completion's, the first null) and vLLM's `prompt_logprobs`.

lm-evaluation-harness scores multiple-choice tasks this way: token-id prompts, `echo: true`,
`logprobs: 1`, `max_tokens: 1`, and reads `token_logprobs` and `top_logprobs` after the context. The
prompt logprobs are computed where the prompt is (engine.prompt_logprobs) and arrive with the first
output token.
"""

from __future__ import annotations

from router.api_models import CompletionRequest
from router.served_model import ServedModel
from wire.requests import TokenLogprob


def prompt_logprobs_asked(body: CompletionRequest) -> int | None:
    """How many alternatives each prompt token's entry needs (None: no prompt logprobs are needed)."""
    asked = [k for k in (body.prompt_logprobs, body.logprobs if body.echo else None) if k is not None]
    return max(asked) if asked else None


async def prompt_texts(prompt, prompts: list[list[int]], model: ServedModel) -> list[str]:
    """Each prompt's text as echoed: the string as given, or its token ids decoded (on a thread when long)."""
    if isinstance(prompt, str):
        return [prompt]
    if prompt and all(isinstance(p, str) for p in prompt):
        return list(prompt)
    return [await model.decode_async(ids) for ids in prompts]


def vllm_prompt_logprobs(texts: dict[int, str], prompt_ids: list[int], entries: tuple[TokenLogprob | None, ...],
                         top: int) -> list[dict | None]:  # fmt: skip
    """vLLM's `prompt_logprobs`: per prompt token, None for the first, else {token id: {logprob, rank,
    decoded_token}} for the token itself and its `top` alternatives; `texts` each token's
    (`ServedModel.token_texts`)."""
    out = []
    for token, entry in zip(prompt_ids, entries):
        if entry is None:
            out.append(None)
            continue
        ranked = {token: (entry.logprob, entry.rank)}
        for rank, (alt, logprob) in enumerate(entry.top[:top], start=1):
            ranked.setdefault(alt, (logprob, rank))
        out.append({str(t): {"logprob": lp, "rank": r, "decoded_token": texts[t]}
                    for t, (lp, r) in ranked.items()})  # fmt: skip
    return out
