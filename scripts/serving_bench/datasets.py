"""Request samples for the serving benchmark: `random`, `prefix-repetition` and ShareGPT-format files.

Every generator takes a seeded `numpy.random.Generator` and a Hugging Face tokenizer and
returns `SampleRequest`s whose `prompt_len` is the token count of `prompt` under that
tokenizer (what the server will see, up to its special tokens).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np

from planner.workload import length_range

# ShareGPT filtering, as vLLM does: drop tiny pairs and the ones too long for a small context.
SHAREGPT_MIN_LEN, SHAREGPT_MAX_PROMPT_LEN, SHAREGPT_MAX_TOTAL_LEN = 4, 1024, 2048


@dataclass(frozen=True)
class SampleRequest:
    prompt: str
    prompt_len: int
    expected_output_len: int


def _usable_token_ids(tokenizer) -> np.ndarray:
    """Ids that decode alone to text: no special tokens, no stray bytes of a multi-byte character."""
    special = set(tokenizer.all_special_ids)
    return np.array([i for i in range(len(tokenizer)) if i not in special and "\ufffd" not in tokenizer.decode([i])])


def random_text(rng: np.random.Generator, tokenizer, vocab: np.ndarray, num_tokens: int) -> tuple[str, int]:
    """Text of random tokens that re-tokenizes to `num_tokens` tokens (or near it); (text, its token count)."""
    ids = rng.choice(vocab, size=num_tokens).tolist()
    for _ in range(10):  # decoding then encoding can merge or split tokens: cut or pad until it holds
        text = tokenizer.decode(ids)
        ids = tokenizer.encode(text, add_special_tokens=False)
        if len(ids) == num_tokens:
            break
        ids = ids[:num_tokens] + rng.choice(vocab, size=max(0, num_tokens - len(ids))).tolist()
    return text, len(tokenizer.encode(text, add_special_tokens=False))


def random_requests(rng, tokenizer, num_prompts: int, input_len: int, output_len: int,
                    range_ratio: float = 0.0) -> list[SampleRequest]:  # fmt: skip
    """Prompts of random tokens; input and output lengths uniform in length_range(len, range_ratio)."""
    vocab = _usable_token_ids(tokenizer)
    in_lo, in_hi = length_range(input_len, range_ratio)
    out_lo, out_hi = length_range(output_len, range_ratio)
    requests = []
    for n_in, n_out in zip(rng.integers(in_lo, in_hi + 1, num_prompts), rng.integers(out_lo, out_hi + 1, num_prompts)):
        text, prompt_len = random_text(rng, tokenizer, vocab, int(n_in))
        requests.append(SampleRequest(text, prompt_len, int(n_out)))
    return requests


def prefix_repetition_requests(rng, tokenizer, num_prompts: int, prefix_len: int, suffix_len: int,
                               num_prefixes: int, output_len: int) -> list[SampleRequest]:  # fmt: skip
    """`num_prefixes` groups sharing a random `prefix_len`-token prefix (a system prompt), each prompt
    ending in its own random `suffix_len`-token suffix (a question); groups interleaved in random order.

    This is SGLang's generated-shared-prefix workload too: groups = num_prefixes, prompts per group =
    num_prompts / num_prefixes, system prompt length = prefix_len, question length = suffix_len.
    """
    if num_prompts % num_prefixes:
        raise ValueError(f"num_prompts ({num_prompts}) must be a multiple of num_prefixes ({num_prefixes})")
    vocab = _usable_token_ids(tokenizer)
    requests = []
    for _ in range(num_prefixes):
        prefix, _ = random_text(rng, tokenizer, vocab, prefix_len)
        for _ in range(num_prompts // num_prefixes):
            suffix, _ = random_text(rng, tokenizer, vocab, suffix_len)
            prompt = f"{prefix} {suffix}"
            requests.append(SampleRequest(prompt, len(tokenizer.encode(prompt, add_special_tokens=False)), output_len))
    return [requests[i] for i in rng.permutation(len(requests))]


def sharegpt_requests(rng, tokenizer, path: str, num_prompts: int, output_len: int | None = None) -> list[SampleRequest]:
    """The first human turn of each conversation as the prompt; the first reply's token count (or
    `output_len`) as the output length. Conversations in random order; too short or long pairs dropped."""
    with open(path) as f:
        conversations = [d["conversations"] for d in json.load(f) if len(d.get("conversations", ())) >= 2]
    requests = []
    for i in rng.permutation(len(conversations)):
        prompt, reply = conversations[i][0]["value"], conversations[i][1]["value"]
        prompt_len = len(tokenizer.encode(prompt, add_special_tokens=False))
        n_out = output_len or len(tokenizer.encode(reply, add_special_tokens=False))
        too_short = prompt_len < SHAREGPT_MIN_LEN or n_out < SHAREGPT_MIN_LEN
        if too_short or prompt_len > SHAREGPT_MAX_PROMPT_LEN or prompt_len + n_out > SHAREGPT_MAX_TOTAL_LEN:
            continue
        requests.append(SampleRequest(prompt, prompt_len, n_out))
        if len(requests) == num_prompts:
            return requests
    raise ValueError(f"{path} has only {len(requests)} usable conversations, {num_prompts} asked")
