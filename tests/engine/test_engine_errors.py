"""Bad input gets a clear ValueError and the engine keeps serving the others."""

import pytest

from engine import LLM, SamplingParams


@pytest.fixture(scope="module")
def llm(tiny_model_dirs):
    return LLM(tiny_model_dirs["llama"], num_kv_blocks=32, max_model_len=64, dtype="float32")


@pytest.mark.parametrize(
    "prompt, params, message",
    [
        ("", SamplingParams(max_tokens=4), "empty"),
        ({"prompt_token_ids": []}, SamplingParams(max_tokens=4), "empty"),
        ({"prompt_token_ids": list(range(3, 70))}, SamplingParams(max_tokens=4), "max_model_len"),
        ({"prompt_token_ids": [3, 4, 5]}, SamplingParams(max_tokens=62), "max_tokens"),
        ({"prompt_token_ids": [3, 99999]}, SamplingParams(max_tokens=4), "token ids"),
        ({"prompt_token_ids": [3, -1]}, SamplingParams(max_tokens=4), "token ids"),
        ({"wrong": [1]}, SamplingParams(max_tokens=4), "prompt_token_ids"),
        (12, SamplingParams(max_tokens=4), "prompt must be"),
        ("hello", {"temperature": 0}, "SamplingParams"),
    ],
)
def test_bad_request_is_refused_and_engine_keeps_serving(llm, prompt, params, message):
    engine = llm.engine
    engine.add_request("good", {"prompt_token_ids": [5, 6, 7]}, SamplingParams(temperature=0, max_tokens=3))
    with pytest.raises(ValueError, match=message):
        engine.add_request("bad", prompt, params)
    outputs = []
    while engine.has_unfinished_requests():
        outputs += engine.step()
    assert outputs[-1].request_id == "good" and outputs[-1].finished
    assert len(outputs[-1].outputs[0].token_ids) == 3
    assert engine.kv_cache.num_free_blocks == engine.runner.num_blocks


@pytest.mark.parametrize(
    "kwargs",
    [dict(max_tokens=0), dict(max_tokens=-3), dict(temperature=-1.0), dict(top_p=0.0), dict(n=0), dict(top_k=-5)],
)
def test_bad_sampling_values_raise_value_error(kwargs):
    with pytest.raises(ValueError):
        SamplingParams(**kwargs)


def test_duplicate_request_id_and_abort_free_blocks(llm):
    engine = llm.engine
    # ignore_eos: a sampled first token can be the tiny model's EOS, which would end it (and free it) in step 1.
    engine.add_request("a", {"prompt_token_ids": list(range(3, 40))}, SamplingParams(max_tokens=8, ignore_eos=True))
    with pytest.raises(ValueError, match="already in use"):
        engine.add_request("a", {"prompt_token_ids": [3]}, SamplingParams(max_tokens=8))
    engine.step()  # the prompt is being computed: blocks are held
    assert engine.kv_cache.num_free_blocks < engine.runner.num_blocks
    assert engine.abort_request("a")
    assert not engine.abort_request("a")
    assert engine.kv_cache.num_free_blocks == engine.runner.num_blocks
    assert not engine.has_unfinished_requests()


def test_abort_while_waiting_and_generate_error_leaves_nothing_behind(llm):
    engine = llm.engine
    engine.add_request("w", {"prompt_token_ids": [3, 4]}, SamplingParams(max_tokens=2))
    assert engine.abort_request("w")
    with pytest.raises(ValueError):
        llm.generate([{"prompt_token_ids": [3, 4]}, ""], SamplingParams(max_tokens=2, n=2), use_tqdm=False)
    assert engine.num_unfinished_requests == 0 and not engine.has_unfinished_requests()


def test_stop_token_stop_string_and_length(llm):
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    base = llm.generate({"prompt_token_ids": [5, 6, 7]}, params, use_tqdm=False)[0].outputs[0]
    assert base.finish_reason == "length" and len(base.token_ids) == 12
    stop_tok = base.token_ids[4]
    out = llm.generate(
        {"prompt_token_ids": [5, 6, 7]},
        SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, stop_token_ids=[stop_tok]),
        use_tqdm=False,
    )[0].outputs[0]
    first = base.token_ids.index(stop_tok)
    assert out.finish_reason == "stop" and out.stop_reason == stop_tok and out.token_ids == base.token_ids[: first + 1]
    stop_str = base.text[len(base.text) // 2 : len(base.text) // 2 + 2]
    if stop_str.strip():
        out = llm.generate(
            {"prompt_token_ids": [5, 6, 7]},
            SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, stop=[stop_str]),
            use_tqdm=False,
        )[0].outputs[0]
        assert out.finish_reason == "stop" and out.stop_reason == stop_str
        assert out.text == base.text[: base.text.index(stop_str)]


def test_n_and_seed_give_reproducible_distinct_samples(llm):
    params = SamplingParams(temperature=1.0, max_tokens=8, n=3, seed=7, ignore_eos=True)
    a = llm.generate("The quick brown fox", params, use_tqdm=False)[0]
    b = llm.generate("The quick brown fox", params, use_tqdm=False)[0]
    assert [c.token_ids for c in a.outputs] == [c.token_ids for c in b.outputs]
    assert len(a.outputs) == 3 and [c.index for c in a.outputs] == [0, 1, 2]
    assert len({tuple(c.token_ids) for c in a.outputs}) > 1


def test_engine_request_takes_one_sequence(llm):
    with pytest.raises(ValueError, match="n=1"):
        llm.engine.add_request("n2", {"prompt_token_ids": [3, 4]}, SamplingParams(n=2))
    assert not llm.engine.has_unfinished_requests()


def test_failed_step_aborts_its_requests_frees_blocks_and_engine_recovers(llm, monkeypatch):
    from engine.llm_engine import EngineStepError

    engine = llm.engine
    engine.add_request("doomed", {"prompt_token_ids": list(range(3, 30))}, SamplingParams(max_tokens=4))
    real_execute = engine.runner.execute

    def broken(*args):
        raise RuntimeError("simulated kernel failure")

    monkeypatch.setattr(engine.runner, "execute", broken)
    with pytest.raises(EngineStepError, match="simulated kernel failure") as info:
        engine.step()
    assert info.value.request_ids == ["doomed"]
    assert not engine.has_unfinished_requests()
    assert engine.kv_cache.num_free_blocks == engine.runner.num_blocks
    monkeypatch.setattr(engine.runner, "execute", real_execute)
    out = llm.generate({"prompt_token_ids": [3, 4, 5]}, SamplingParams(max_tokens=3, ignore_eos=True), use_tqdm=False)
    assert len(out[0].outputs[0].token_ids) == 3


def test_a_failed_step_ends_only_the_request_that_fails_alone_and_the_others_finish_as_without_it(llm, monkeypatch):
    """A step with a poison prompt and two innocent ones fails; each then recomputes alone: the poison fails
    alone and ends, the innocents finish with the tokens they make without the poison around."""
    from engine.llm_engine import EngineStepError

    engine, greedy = llm.engine, SamplingParams(max_tokens=6, ignore_eos=True, temperature=0.0)
    innocent = {"a": [3, 4, 5, 6, 7], "b": [8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25]}
    alone = {name: llm.generate({"prompt_token_ids": ids}, greedy, use_tqdm=False)[0].outputs[0].token_ids
             for name, ids in innocent.items()}  # fmt: skip
    poison = [31, 31, 31]
    real_execute = engine.runner.execute

    def execute(batch, *args, **kwargs):  # a kernel that fails on one input, as a bug triggered by it would
        ids = batch.input_ids.tolist()
        if any(ids[i : i + 3] == poison for i in range(len(ids) - 2)):
            raise RuntimeError("a kernel failed on this input")
        return real_execute(batch, *args, **kwargs)

    monkeypatch.setattr(engine.runner, "execute", execute)
    for name, ids in innocent.items():
        engine.add_request(name, {"prompt_token_ids": ids}, greedy)
    engine.step()  # both innocents prefill together, and sample their first token
    engine.add_request("poison", {"prompt_token_ids": [5, *poison, 6]}, greedy)
    ended, failures, finished = [], 0, {}
    while engine.has_unfinished_requests():
        try:
            finished |= {out.request_id: out.outputs[0].token_ids for out in engine.step() if out.finished}
        except EngineStepError as err:
            ended, failures = ended + err.request_ids, failures + 1
            assert err.attributed == (err.request_ids == ["poison"])  # its own step's failure is the request's
    assert (ended, failures) == (["poison"], 2)  # the step of all three ended nobody; the poison's own ended it
    assert finished == alone  # recomputed alone, then batched again: the same tokens
    assert engine.kv_cache.num_free_blocks == engine.runner.num_blocks
