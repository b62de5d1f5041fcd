"""output_text: the one owner of a sequence's output text (see docs/DESIGN.md, "Who owns the text").

Workers stream token ids; text is made from them in one place per process that answers a client: the
router for every HTTP request, `engine.llm.LLM` offline. Both use `TextStream` (`stream`): the
tokenizer's incremental decoder (`incremental`) and the stop-string matcher (`stop_strings`), on the
whole output of a sequence, so a request resumed on another worker is simply more tokens of the same
stream. Stop token ids, EOS, max_tokens and min_tokens stay with the engine core, which needs no text.

A leaf: the `tokenizers` library only, no torch and no other Tandem package (`tests/output_text/test_leaf.py`),
so the router imports it without the engine.
"""

from output_text.stream import TextOptions, TextStream

__all__ = ["TextOptions", "TextStream"]
