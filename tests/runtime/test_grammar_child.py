"""The grammar compile process (runtime.grammar_child) with a tiny model's vocabulary: a valid grammar compiles
there, an invalid one is the request's fault, one past the timeout is stopped and the next compile starts a
fresh child."""

from __future__ import annotations

import json

import pytest
from transformers import AutoTokenizer

from engine.structured_output import GrammarError
from runtime.grammar_child import GrammarChild, GrammarTimeout
from tests.tiny_models import VOCAB_SIZE

# 900 optional properties of two types each: seconds to compile, even over a tiny vocabulary.
SLOW_SCHEMA = json.dumps({"type": "object",
                          "properties": {f"p{i}": {"type": ["string", "integer"]} for i in range(900)}})  # fmt: skip


@pytest.fixture(scope="module")
def tokenizer_info(tiny_model_dirs):
    import xgrammar as xgr

    info = xgr.TokenizerInfo.from_huggingface(AutoTokenizer.from_pretrained(tiny_model_dirs["llama"]),
                                              vocab_size=VOCAB_SIZE)  # fmt: skip
    return lambda: info


def test_a_valid_grammar_compiles_in_the_child_and_an_invalid_one_is_refused(tokenizer_info):
    child = GrammarChild(tokenizer_info, timeout_s=60)
    try:
        child.check("regex", "ab+c")
        with pytest.raises(GrammarError, match="invalid regex for structured output"):
            child.check("regex", "a(b")
        child.check("choice", '["yes", "no"]')  # the same child goes on
    finally:
        child.close()


def test_a_compile_past_the_timeout_is_stopped_and_the_next_runs_in_a_new_child(tokenizer_info):
    child = GrammarChild(tokenizer_info, timeout_s=0.2)
    try:
        child.check("regex", "x")  # the child's start (seconds) is not part of any compile's time
        first = child.pid
        with pytest.raises(GrammarTimeout, match="did not compile within 0.2 s"):
            child.check("json", SLOW_SCHEMA)
        child.check("regex", "ab+c")
        assert child.pid != first  # the child that overran was killed
    finally:
        child.close()
