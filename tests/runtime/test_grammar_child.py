"""The grammar compile process (runtime.grammar_child) with a tiny model's vocabulary: a grammar compiled there
matches here, an invalid one is the request's fault, one past the timeout is stopped and the next compile
starts a fresh child."""

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


def _matches(compiled, text: str) -> bool:
    import xgrammar as xgr

    return xgr.GrammarMatcher(compiled).accept_string(text)


def test_a_grammar_compiled_in_the_child_matches_here_and_an_invalid_one_is_refused(tokenizer_info):
    child = GrammarChild(tokenizer_info, timeout_s=60)
    try:
        compiled = child.compile("regex", "ab+c")
        assert _matches(compiled, "abbc") and not _matches(compiled, "ax")
        with pytest.raises(GrammarError, match="invalid regex for structured output"):
            child.compile("regex", "a(b")
        assert _matches(child.compile("choice", '["yes", "no"]'), "no")  # the same child goes on
    finally:
        child.close()


def test_a_compile_past_the_timeout_is_stopped_and_the_next_runs_in_a_new_child(tokenizer_info):
    child = GrammarChild(tokenizer_info, timeout_s=0.2)
    try:
        child.compile("regex", "x")  # the child's start (seconds) is not part of any compile's time
        with pytest.raises(GrammarTimeout, match="did not compile within 0.2 s"):
            child.compile("json", SLOW_SCHEMA)
        assert _matches(child.compile("regex", "ab+c"), "abbc")
    finally:
        child.close()
