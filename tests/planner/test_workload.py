"""Workloads in vllm bench serve's terms, and trace files in Mooncake's shape."""

from __future__ import annotations

import json
import math

import pytest

from planner.trace import read_trace
from planner.workload import WorkloadSpec, vllm_arrival_times


def test_random_lengths_stay_in_vllms_range():
    reqs = WorkloadSpec(num_prompts=200, random_input_len=100, random_output_len=50, random_range_ratio=0.5,
                        random_prefix_len=16).requests(5000)  # fmt: skip
    assert all(16 + 50 <= len(r.prompt) <= 16 + 150 and 25 <= r.output_len <= 75 for r in reqs)
    assert len({r.prompt[:16] for r in reqs}) == 1 and len({r.prompt[16:32] for r in reqs}) == 200
    assert all(r.arrival_s == 0 for r in reqs)  # request rate inf: all at once


def test_prefix_repetition_groups_share_their_prefix():
    reqs = WorkloadSpec("prefix_repetition", num_prompts=12, prefix_repetition_prefix_len=32,
                        prefix_repetition_suffix_len=8, prefix_repetition_num_prefixes=3,
                        prefix_repetition_output_len=5).requests(5000)  # fmt: skip
    assert len(reqs) == 12 and {len(r.prompt) for r in reqs} == {40} and {r.output_len for r in reqs} == {5}
    prefixes = [r.prompt[:32] for r in reqs]
    assert len(set(prefixes)) == 3 and all(prefixes.count(p) == 4 for p in set(prefixes))


def test_prefix_repetition_sends_what_vllm_sends_in_its_order():
    # vLLM: num_prompts // num_prefixes of each, its prefix-major list shuffled by random.seed(seed)'s shuffle.
    spec = WorkloadSpec("prefix_repetition", num_prompts=14, prefix_repetition_prefix_len=16,
                        prefix_repetition_suffix_len=4, prefix_repetition_num_prefixes=3, seed=5)  # fmt: skip
    reqs = spec.requests(5000)
    assert len(reqs) == 12
    vllm_order = [10, 2, 11, 7, 1, 3, 6, 0, 8, 5, 4, 9]  # random.seed(5); random.shuffle(list(range(12)))
    group_of = {}
    for req, listed in zip(reqs, vllm_order):
        assert group_of.setdefault(req.prompt[:16], listed // 4) == listed // 4
    assert len(group_of) == 3
    with pytest.raises(ValueError, match="num-prefixes: must be >= 1 and at most --num-prompts"):
        WorkloadSpec("prefix_repetition", num_prompts=2, prefix_repetition_num_prefixes=3).requests()


def test_arrivals_are_vllms_poisson_draws_scaled_to_the_rate():
    times = vllm_arrival_times(0, 4000, 2.0)
    assert 0 < times[0] < times[1] and all(b >= a for a, b in zip(times, times[1:]))
    assert times[-1] == pytest.approx(2000.0)  # vLLM scales the sum so the last goes at num / rate
    gaps = [b - a for a, b in zip(times, times[1:])]
    assert sorted(gaps)[len(gaps) // 2] == pytest.approx(0.5 * math.log(2), rel=0.1)  # an exponential's median
    spec = WorkloadSpec(num_prompts=5, request_rate=3.0, burstiness=0.5, seed=7)
    assert spec.requests() == spec.requests()


def test_prefix_repetition_arrives_when_vllm_sent_it():
    # vLLM's prefix_repetition draws its token ids from the generator its client then draws the gaps from.
    # Measured: `vllm bench serve` 0.32 with these flags and SmolLM2's tokenizer (vocabulary 49,152) sent its
    # first six requests at these times (its saved start_times, from the first).
    spec = WorkloadSpec("prefix_repetition", num_prompts=40, prefix_repetition_prefix_len=768,
                        prefix_repetition_suffix_len=48, prefix_repetition_num_prefixes=8, request_rate=1.2,
                        seed=103)  # fmt: skip
    times = [r.arrival_s for r in spec.requests(49152)]
    assert [t - times[0] for t in times[:6]] == pytest.approx([0.0, 0.054, 1.904, 2.845, 6.028, 6.862], abs=0.002)


def test_bad_flags_name_themselves():
    with pytest.raises(ValueError, match="--random-range-ratio"):
        WorkloadSpec(random_range_ratio=1.5)
    with pytest.raises(ValueError, match="--dataset-name"):
        WorkloadSpec(dataset_name="sharegpt")
    with pytest.raises(ValueError, match="--request-rate"):
        WorkloadSpec(request_rate=0)
    assert WorkloadSpec(request_rate=math.inf, ignore_eos=True).caveats == ()


def test_a_trace_shares_the_blocks_its_hash_ids_share(tmp_path):
    path = tmp_path / "trace.jsonl"
    lines = [{"timestamp": 1000, "input_length": 1000, "output_length": 10, "hash_ids": [1, 2]},
             {"timestamp": 1500, "input_length": 700, "output_length": 3, "hash_ids": [1, 3]},
             {"timestamp": 1200, "input_length": 5, "output_length": 1}]  # fmt: skip
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    reqs = read_trace(path, block_tokens=512)
    assert [r.arrival_s for r in reqs] == pytest.approx([0.0, 0.2, 0.5])  # from the trace's start, in order
    first, last = reqs[0], reqs[2]
    assert len(first.prompt) == 1000 and len(last.prompt) == 700
    assert first.prompt[:512] == last.prompt[:512] and first.prompt[512:700] != last.prompt[512:700]


@pytest.mark.parametrize("line, field", [
    ('{"timestamp": 1, "input_length": 0, "output_length": 3}', "input_length"),
    ('{"timestamp": "soon", "input_length": 5, "output_length": 3}', "timestamp"),
    ('{"timestamp": 1, "input_length": 5}', "output_length"),
    ('{"timestamp": 1, "input_length": 5, "output_length": 3, "hash_ids": ["a"]}', "hash_ids"),
    ("[1, 2]", "JSON object"),
])  # fmt: skip
def test_a_malformed_trace_line_is_named(tmp_path, line, field):
    path = tmp_path / "t.jsonl"
    path.write_text('{"timestamp": 0, "input_length": 5, "output_length": 3}\n' + line + "\n")
    with pytest.raises(ValueError, match=rf"t.jsonl:2: .*{field}"):
        read_trace(path)
