"""Structured outputs in the engine (engine.structured_output): each kind's grammar constrains greedy and
random sampling, rows of one batch keep their own grammars, and a resumed request continues its grammar
after the output it already produced."""

from __future__ import annotations

import json
import re

import pytest

from engine import LLM, SamplingParams
from engine.structured_output import GrammarCompiler, GrammarError, grammar_of

SCHEMA = {"type": "object", "properties": {"answer": {"enum": ["yes", "no"]}, "sure": {"type": "boolean"}},
          "required": ["answer", "sure"], "additionalProperties": False}  # fmt: skip
PROMPTS = ([5, 17, 42], [9, 8, 7, 6], [3, 1, 4, 1, 5])


@pytest.fixture(scope="module")
def llm(tiny_model_dirs):
    return LLM(model=tiny_model_dirs["llama"], dtype="float32", max_model_len=256, num_kv_blocks=64)


def _outputs(llm, structured, temperature=0.0, seed=None, prompts=PROMPTS, max_tokens=64):
    params = SamplingParams(temperature=temperature, seed=seed, max_tokens=max_tokens, structured=structured)
    return [r.outputs[0] for r in llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)]


@pytest.mark.parametrize("temperature,seed", [(0.0, None), (1.0, 11)])
def test_every_kind_constrains_the_output(llm, temperature, seed):
    for out in _outputs(llm, ("json", json.dumps(SCHEMA)), temperature, seed):
        value = json.loads(out.text)
        assert value["answer"] in ("yes", "no") and isinstance(value["sure"], bool) and out.finish_reason == "stop"
    for out in _outputs(llm, ("choice", json.dumps(["red", "green", "blue"])), temperature, seed):
        assert out.text in ("red", "green", "blue") and out.finish_reason == "stop"
    for out in _outputs(llm, ("regex", "[a-c]{3}-[0-9]"), temperature, seed):
        assert re.fullmatch("[a-c]{3}-[0-9]", out.text) and out.finish_reason == "stop"
    for out in _outputs(llm, ("grammar", 'root ::= "<" ("x" | "y")+ ">"'), temperature, seed, max_tokens=200):
        assert re.fullmatch("<[xy]+>", out.text), out.text
    for out in _outputs(llm, ("json_object", ""), temperature, seed, prompts=[[9, 8, 7, 6]]):
        assert out.text.startswith("{")  # a random model may never close it: where it does, it parses
        assert out.finish_reason == "length" or isinstance(json.loads(out.text), dict)


def test_rows_of_one_batch_keep_their_own_grammars(llm):
    prompts = [{"prompt_token_ids": p} for p in PROMPTS]
    kinds = [("choice", '["up", "down"]'), None, ("regex", "[0-9]{4}")]
    engine = llm.engine
    for i, (prompt, structured) in enumerate(zip(prompts, kinds)):
        engine.add_request(f"b{i}", prompt, SamplingParams(temperature=0, max_tokens=12, structured=structured))
    done = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                done[out.request_id] = out.outputs[0].token_ids
    text = {rid: llm.engine.tokenizer.decode(ids, skip_special_tokens=True) for rid, ids in done.items()}
    assert text["b0"] in ("up", "down") and re.fullmatch("[0-9]{4}", text["b2"])
    free = _outputs(llm, None, prompts=[PROMPTS[1]], max_tokens=12)[0]
    assert done["b1"] == free.token_ids  # the unconstrained row is untouched by its neighbours' masks


def test_a_resumed_request_continues_its_grammar_after_the_output_it_already_had(llm):
    whole = _outputs(llm, ("json", json.dumps(SCHEMA)), prompts=[PROMPTS[0]])[0]
    cut = 7
    resumed = list(PROMPTS[0]) + whole.token_ids[:cut]
    params = SamplingParams(temperature=0, max_tokens=64, structured=("json", json.dumps(SCHEMA)),
                            resumed_output_tokens=cut)  # fmt: skip
    rest = llm.generate([{"prompt_token_ids": resumed}], params, use_tqdm=False)[0].outputs[0]
    assert whole.token_ids[:cut] + rest.token_ids == whole.token_ids
    # Without being told, the same prompt would start the grammar afresh: a different output.
    fresh = llm.generate([{"prompt_token_ids": resumed}], SamplingParams(
        temperature=0, max_tokens=64, structured=("json", json.dumps(SCHEMA))), use_tqdm=False)[0].outputs[0]
    assert fresh.text.startswith("{") and fresh.token_ids != rest.token_ids


def test_invalid_specs_are_refused_with_the_reason(llm):
    for structured, words in ((("json", '{"type": "object", "properties": 3}'), "properties must be an object"),
                              (("regex", "a(b"), "Regex parsing error"), (("grammar", "root ::= "), "EBNF"),
                              (("choice", "[]"), "non-empty list")):  # fmt: skip
        with pytest.raises(GrammarError, match=words) as refused:
            llm.engine.add_request("bad", {"prompt_token_ids": [1, 2]}, SamplingParams(structured=structured))
        assert "/project/" not in str(refused.value)  # the reason, not xgrammar's source path
    assert not llm.engine.has_unfinished_requests()
    resumed_wrong = SamplingParams(structured=("choice", '["ab"]'), resumed_output_tokens=1)
    with pytest.raises(GrammarError, match="resumed output"):
        llm.engine.add_request("bad", {"prompt_token_ids": [1, 2]}, resumed_wrong)
    with pytest.raises(ValueError, match="structured kind"):
        SamplingParams(structured=("yaml", ""))


def test_every_kind_has_a_grammar():
    for kind, spec in (("json", json.dumps(SCHEMA)), ("json_object", ""), ("regex", "a+"),
                       ("choice", json.dumps(['say "hi"\n', "ünï"])), ("grammar", 'root ::= "a"')):  # fmt: skip
        assert grammar_of(kind, spec) is not None


def test_compiled_grammars_are_bounded_by_their_bytes_least_recently_used_first_out(tiny_model_dirs):
    from transformers import AutoTokenizer

    from tests.tiny_models import VOCAB_SIZE

    def compiler(cache_bytes: int) -> GrammarCompiler:
        return GrammarCompiler(lambda: AutoTokenizer.from_pretrained(tiny_model_dirs["llama"]), VOCAB_SIZE, [],
                               cache_bytes=cache_bytes)  # fmt: skip

    a, b, c = (("regex", f"[a-z]{{{n}}}-[0-9]") for n in (3, 4, 2))
    sizes = {spec: compiler(2**30).compiled(*spec).memory_size_bytes for spec in (a, b, c)}
    assert sizes[c] <= sizes[b]  # c takes b's room: one eviction
    grammars = compiler(sizes[a] + sizes[b])
    first_a = grammars.compiled(*a)
    grammars.compiled(*b)
    assert grammars.cached(a) is first_a and grammars.cache.bytes == sizes[a] + sizes[b]  # both fit
    grammars.compiled(*c)  # past the bound: b, used least recently (a was just looked up), goes
    assert grammars.cached(b) is None and grammars.cached(a) is first_a and grammars.cached(c) is not None
    assert grammars.cache.bytes == sizes[a] + sizes[c] <= grammars.cache.limit_bytes
    # A grammar bigger than the whole bound is compiled but not kept, and evicts nothing.
    big = ("json", json.dumps({"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(60)}}))
    assert grammars.compiled(*big).memory_size_bytes > grammars.cache.limit_bytes
    assert grammars.cached(big) is None and len(grammars.cache) == 2
    assert grammars._compiler().get_cache_size_bytes() == 0  # xgrammar's own (unbounded) cache is not used
