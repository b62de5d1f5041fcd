"""The engine core makes token ids only; the offline frontend (`LLM`) makes the text and decides stop strings."""

import pytest

from engine import LLM, SamplingParams

PROMPT = {"prompt_token_ids": [5, 6, 7]}
GREEDY = dict(temperature=0, max_tokens=12, ignore_eos=True)


@pytest.fixture(scope="module")
def llm(tiny_model_dirs):
    return LLM(tiny_model_dirs["llama"], num_kv_blocks=32, max_model_len=64)


@pytest.fixture(scope="module")
def base(llm):
    """The greedy output with no stop string, and a stop string from the middle of its text."""
    out = llm.generate(PROMPT, SamplingParams(**GREEDY), use_tqdm=False)[0].outputs[0]
    middle = len(out.text) // 2
    assert out.text == llm.tokenizer.decode(out.token_ids) and len(out.text) > 4
    return out, out.text[middle : middle + 2]


def test_the_engine_core_neither_makes_text_nor_stops_on_a_stop_string(llm, base):
    full, stop = base
    engine = llm.engine
    engine.add_request("core", PROMPT, SamplingParams(**GREEDY, stop=[stop]))
    outputs = []
    while engine.has_unfinished_requests():
        outputs += engine.step()
    last = outputs[-1].outputs[0]
    assert last.token_ids == full.token_ids and last.finish_reason == "length"
    assert all(o.outputs[0].text == "" for o in outputs)


@pytest.mark.parametrize("include", [False, True])
def test_llm_ends_a_request_at_the_token_that_completes_its_stop_string(llm, base, include):
    full, stop = base
    params = SamplingParams(**GREEDY, stop=[stop], include_stop_str_in_output=include, logprobs=0)
    out = llm.generate(PROMPT, params, use_tqdm=False)[0].outputs[0]
    decode = llm.tokenizer.decode
    k = next(k for k in range(1, len(full.token_ids) + 1) if stop in decode(full.token_ids[:k]))
    cut = full.text.index(stop) + (len(stop) if include else 0)
    assert (out.finish_reason, out.stop_reason, out.text) == ("stop", stop, full.text[:cut])
    assert out.token_ids == full.token_ids[:k] and len(out.logprobs) == k
    assert not llm.engine.has_unfinished_requests()  # aborted in the engine: its blocks are back
    assert llm.engine.kv_cache.num_free_blocks == llm.engine.runner.num_blocks


def test_stop_strings_without_a_tokenizer_are_refused_and_nothing_is_left_queued(tiny_model_dirs):
    llm = LLM(tiny_model_dirs["llama"], skip_tokenizer_init=True, num_kv_blocks=32, max_model_len=64)
    with pytest.raises(ValueError, match="stop strings need a tokenizer"):
        llm.generate(PROMPT, SamplingParams(**GREEDY, stop=["x"]), use_tqdm=False)
    assert not llm.engine.has_unfinished_requests()
    out = llm.generate(PROMPT, SamplingParams(**GREEDY), use_tqdm=False)[0].outputs[0]
    assert out.text == "" and len(out.token_ids) == 12
