"""The router's tokenizer fast path gives exactly the ids transformers' tokenizer call gives."""

from __future__ import annotations

import pytest

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


def test_long_texts_are_refused_by_length_or_tokenized_off_the_event_loop(tiny_model_dirs):
    import asyncio
    import time

    from router.errors import APIError
    from router.served_model import OFF_LOOP_CHARS

    model = ServedModel(RouterConfig(tiny_model_dirs["llama"], max_model_len=256))
    text = "hello world " * (OFF_LOOP_CHARS // 12 + 1)
    with pytest.raises(APIError) as refused:  # far past what 256 tokens can hold: no tokenizing at all
        asyncio.run(model.encode_async("x" * (model.max_prompt_chars + 1)))
    assert refused.value.status == 400 and "cannot fit" in refused.value.message

    model.max_prompt_chars = 10**9  # the long text below is tokenized (a tiny model's context is 256 tokens)

    async def beside_a_long_text():
        gaps, done = [], asyncio.Event()

        async def tick():
            last = time.perf_counter()
            while not done.is_set():
                await asyncio.sleep(0.001)
                gaps.append(time.perf_counter() - last)
                last = time.perf_counter()

        ticker = asyncio.create_task(tick())
        ids = await model.encode_async(text * 20)
        done.set()
        await ticker
        return ids, max(gaps)

    ids, longest_gap = asyncio.run(beside_a_long_text())
    assert ids == model.tokenizer(text * 20)["input_ids"]
    assert longest_gap < 0.05  # the loop kept turning while the text was tokenized


def test_a_chat_of_more_messages_than_context_tokens_is_refused_before_its_template(tiny_model_dirs):
    import asyncio

    from router.errors import APIError
    from router.served_model import OFF_LOOP_MESSAGES
    from tests.e2e.router_cluster import CHAT_TEMPLATE

    model = ServedModel(RouterConfig(tiny_model_dirs["llama"], max_model_len=256, chat_template=CHAT_TEMPLATE))
    with pytest.raises(APIError) as refused:
        asyncio.run(model.encode_chat_async([{"role": "user", "content": "a"}] * 257))
    assert refused.value.status == 400 and "257 messages cannot fit" in refused.value.message
    many = [{"role": "user", "content": "a"}] * OFF_LOOP_MESSAGES  # rendered on a thread: the same ids

    assert asyncio.run(model.encode_chat_async(many)) == model.encode_chat(many)


def _token_text_one_by_one(tokenizer, token_id: int) -> str:
    """What logprobs showed before the batched call: one decode per token, its vocabulary form when partial."""
    text = tokenizer.decode([token_id])
    return tokenizer.convert_ids_to_tokens(token_id) if "\ufffd" in text else text


def test_token_texts_in_one_call_equal_one_decode_per_token_over_every_tiny_models_vocabulary(tiny_model_dirs):
    for arch, model_dir in tiny_model_dirs.items():
        model = ServedModel(RouterConfig(model_dir))
        ids = [*range(model.vocab_size), 5, 5]  # repeats come back once
        texts = model.token_texts(ids)
        assert list(texts) == list(range(model.vocab_size)), arch
        assert texts == {t: _token_text_one_by_one(model.tokenizer, t) for t in range(model.vocab_size)}, arch
        assert any("\ufffd" in model.tokenizer.decode([t]) for t in texts) or arch != "llama"  # the partial path ran


def test_many_token_texts_are_rendered_off_the_event_loop(tiny_model_dirs):
    import asyncio
    import threading

    from router.served_model import OFF_LOOP_TOKEN_TEXTS

    model = ServedModel(RouterConfig(tiny_model_dirs["llama"]))
    threads = []
    model.token_texts = lambda ids, plain=model.token_texts: threads.append(threading.get_ident()) or plain(ids)

    async def render(count: int) -> dict[int, str]:
        return await model.token_texts_async(t % model.vocab_size for t in range(count))

    loop_thread = threading.get_ident()
    few, many = asyncio.run(render(10)), asyncio.run(render(OFF_LOOP_TOKEN_TEXTS))
    assert threads[0] == loop_thread and threads[1] != loop_thread
    assert len(few) == 10 and len(many) == min(OFF_LOOP_TOKEN_TEXTS, model.vocab_size)
