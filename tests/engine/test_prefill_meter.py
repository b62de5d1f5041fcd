"""The engine measures its own prompt rate: every prompt token counted once, cached ones included."""

from __future__ import annotations

from engine import EngineArgs, LLMEngine, SamplingParams

GREEDY = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
SHARED = [(7 * i + 3) % 300 + 5 for i in range(40)]  # two full blocks of 16, then 8 more


def _finish(engine: LLMEngine) -> None:
    while engine.has_unfinished_requests():
        engine.step()


def test_prompt_tokens_are_counted_once_with_cached_ones_credited(tiny_model_dirs):
    args = EngineArgs(model=tiny_model_dirs["llama"], num_kv_blocks=32, max_model_len=128, dtype="float32",
                      max_num_batched_tokens=24)  # chunked: the first prompt takes two steps  # fmt: skip
    engine = LLMEngine.from_args(args, show_progress=False)
    first, second = SHARED + [9, 8, 7], SHARED + [1, 2]
    engine.add_request("a", first, GREEDY)
    _finish(engine)
    after_first = engine.prefill_meter.tokens
    engine.add_request("b", second, GREEDY)  # its first 32 tokens come from the prefix cache
    _finish(engine)

    assert engine.requests == {} and engine.scheduler.has_unfinished() is False
    assert after_first == len(first)  # decode steps advance no prompt token
    assert engine.prefill_meter.tokens == len(first) + len(second)
    assert engine.prefill_meter.seconds > 0
