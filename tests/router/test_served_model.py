"""The router's tokenizer fast path gives exactly the ids transformers' tokenizer call gives."""

from __future__ import annotations

from router.config import RouterConfig
from router.served_model import ServedModel

TEXTS = ["The quick brown fox.", "  leading spaces and\ttabs\n\nnewlines", "héllo wörld ✓ 你好", "</s><s> special", ""]


def test_encode_equals_the_tokenizer_call_for_every_tiny_model(tiny_model_dirs):
    for arch, model_dir in tiny_model_dirs.items():
        model = ServedModel(RouterConfig(model_dir))
        for text in TEXTS:
            assert model.encode(text) == model.tokenizer(text)["input_ids"], (arch, text)
            plain = model.tokenizer(text, add_special_tokens=False)["input_ids"]
            assert model.encode(text, add_special_tokens=False) == plain, (arch, text)
        assert model.vocab_size == len(model.tokenizer)
