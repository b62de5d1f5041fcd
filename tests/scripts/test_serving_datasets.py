"""scripts/serving_bench/datasets.py: the random, prefix-repetition and ShareGPT generators on a tiny tokenizer."""

from __future__ import annotations

import json

import numpy as np
import pytest
from transformers import AutoTokenizer

from scripts.serving_bench.datasets import (length_range, prefix_repetition_requests, random_requests,
                                            sharegpt_requests)  # fmt: skip


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dirs):
    return AutoTokenizer.from_pretrained(tiny_model_dirs["llama"])


def _count(tokenizer, text: str) -> int:
    return len(tokenizer.encode(text, add_special_tokens=False))


def test_length_range():
    assert length_range(100, 0.0) == (100, 100) and length_range(100, 0.25) == (75, 125)
    assert length_range(3, 0.9) == (1, 6)
    with pytest.raises(ValueError):
        length_range(10, 1.0)


def test_random_requests_are_seeded_and_within_the_ranges(tokenizer):
    make = lambda seed: random_requests(np.random.default_rng(seed), tokenizer, 20, 32, 16, 0.5)  # noqa: E731
    requests = make(7)
    assert requests == make(7) and requests != make(8)
    assert all(8 <= r.expected_output_len <= 24 for r in requests)
    assert len({r.expected_output_len for r in requests}) > 3
    for r in requests:
        assert r.prompt_len == _count(tokenizer, r.prompt) and 16 <= r.prompt_len <= 48, r
    fixed = random_requests(np.random.default_rng(0), tokenizer, 5, 32, 16)
    assert [r.expected_output_len for r in fixed] == [16] * 5
    assert [r.prompt_len for r in fixed] == [32] * 5 and all("\ufffd" not in r.prompt for r in fixed)


def test_prefix_repetition_groups_share_a_prefix(tokenizer):
    requests = prefix_repetition_requests(np.random.default_rng(0), tokenizer, 12, 40, 8, 3, 10)
    assert len(requests) == 12 and {r.expected_output_len for r in requests} == {10}
    groups: dict[str, int] = {}
    for r in requests:
        prefix = tokenizer.decode(tokenizer.encode(r.prompt, add_special_tokens=False)[:30])
        groups[prefix] = groups.get(prefix, 0) + 1
        assert r.prompt_len == _count(tokenizer, r.prompt)
    assert sorted(groups.values()) == [4, 4, 4]
    assert len({r.prompt for r in requests}) == 12  # each with its own suffix
    assert [r.prompt for r in requests[:4]] != [requests[0].prompt] * 4  # interleaved, not group by group
    with pytest.raises(ValueError):
        prefix_repetition_requests(np.random.default_rng(0), tokenizer, 10, 40, 8, 3, 10)


def test_sharegpt_takes_first_turns_and_drops_unusable_pairs(tokenizer, tmp_path):
    long_text = "the quick brown fox jumps over the lazy dog " * 4
    data = [
        {"conversations": [{"from": "human", "value": f"question {i}: {long_text}"},
                           {"from": "gpt", "value": f"answer {i}: {long_text}"}]}  # fmt: skip
        for i in range(5)
    ]
    data.append({"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": long_text}]})  # too short
    data.append({"conversations": [{"from": "human", "value": long_text}]})  # no reply
    path = tmp_path / "sharegpt.json"
    path.write_text(json.dumps(data))
    requests = sharegpt_requests(np.random.default_rng(0), tokenizer, str(path), 5)
    assert sorted(r.prompt.split(":")[0] for r in requests) == [f"question {i}" for i in range(5)]
    for r in requests:
        answer = f"answer {r.prompt.split(':')[0].split()[1]}: {long_text}"
        assert (r.prompt_len, r.expected_output_len) == (_count(tokenizer, r.prompt), _count(tokenizer, answer))
    assert {r.expected_output_len for r in sharegpt_requests(np.random.default_rng(0), tokenizer, str(path), 3, 7)} == {7}
    with pytest.raises(ValueError, match="only 5 usable"):
        sharegpt_requests(np.random.default_rng(0), tokenizer, str(path), 6)
