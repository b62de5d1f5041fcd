"""`quantization="int8"`: a float checkpoint's linears served as Q8_0 blocks made at load
(`engine.int8_weights`), through the engine's real loader and kernels, against the same checkpoint with its
weights rounded to those blocks' values and served widened."""

import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from engine import LLM, SamplingParams
from engine.layers.linear import PreparedLinear
from engine.int8_weights import quantize_linears
from engine.quantized_weight import dequantize, quantize
from tests.engine.native_kernels import native_kernels

PROMPTS = [[1, 5, 9, 17, 33, 65, 129], [1, 200, 100, 50, 25, 12, 6, 3]]


LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "lm_head")


def _rounded_to_q8_0(model_dir: str, out) -> str:
    """A copy of the checkpoint whose linear weights hold their Q8_0 blocks' values."""
    shutil.copytree(model_dir, out)
    for shard in out.glob("*.safetensors"):
        tensors = load_file(shard)
        for name, tensor in tensors.items():
            if any(part in name for part in LINEARS):
                tensors[name] = dequantize(quantize(tensor, "Q8_0")).to(tensor.dtype)
        save_file(tensors, shard, metadata={"format": "pt"})
    return str(out)


@pytest.fixture(scope="module")
def engines(tiny_model_dirs, tmp_path_factory):
    native_kernels()
    common = dict(dtype="float32", kv_cache_memory=16 * 2**20, max_model_len=256)
    rounded = _rounded_to_q8_0(tiny_model_dirs["llama"], tmp_path_factory.mktemp("q8") / "llama")
    return (LLM(model=tiny_model_dirs["llama"], **common, quantization="int8"),
            LLM(model=rounded, **common, quantization="none"))  # fmt: skip


def test_every_linear_and_the_lm_head_take_q8_0_blocks_and_drop_their_dense_weight(engines):
    int8, widened = engines
    model = int8.engine.runner.model
    linears = [m for m in model.modules() if isinstance(m, PreparedLinear)]
    assert linears and {m.quantized.qtype for m in linears} == {"Q8_0"} and all(m.weight is None for m in linears)
    assert model.lm_head_quantized.qtype == "Q8_0"
    assert all(m.quantized is None for m in widened.engine.runner.model.modules() if isinstance(m, PreparedLinear))


def test_its_logprobs_are_those_of_its_blocks_values_widened(engines):
    """The same weights either way; what differs is the sums' order and, where the timing gave a band to an
    integer kernel, the activations' rounding to int8: up to ~0.2 nats on this tiny model's peaked logits (a
    broken product is off by whole nats), which can also turn a greedy token (not compared)."""
    int8, widened = engines
    params = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True, prompt_logprobs=0)
    ours = int8.generate([{"prompt_token_ids": p} for p in PROMPTS], params, use_tqdm=False)
    theirs = widened.generate([{"prompt_token_ids": p} for p in PROMPTS], params, use_tqdm=False)
    for a, b in zip(ours, theirs):
        ours_lp = torch.tensor([e.logprob for e in a.prompt_logprobs[1:]])
        theirs_lp = torch.tensor([e.logprob for e in b.prompt_logprobs[1:]])
        assert (ours_lp - theirs_lp).abs().max() < 0.5, (ours_lp, theirs_lp)
        assert len(a.outputs[0].token_ids) == 16
    assert int8.engine.kv_cache.num_free_blocks == int8.engine.runner.num_blocks


def test_quantizing_a_linear_makes_its_values_its_blocks_and_leaves_partial_blocks_dense():
    """A band the timing gives to a dense kernel reads the weight's values: they must be the blocks' (the same
    model in every band); a row that is not whole blocks of 32 stays as it is."""
    torch.manual_seed(13)
    model = torch.nn.Module()
    model.proj, model.odd = PreparedLinear(), PreparedLinear()
    model.proj.weight = torch.nn.Parameter(torch.randn(40, 64), requires_grad=False)
    model.odd.weight = torch.nn.Parameter(torch.randn(8, 48), requires_grad=False)
    model.lm_head, model.lm_head_quantized = torch.nn.Linear(64, 10, bias=False), None
    odd_before = model.odd.weight.clone()
    assert quantize_linears(model) == {"Q8_0": 2}
    for holder, blocks in ((model.proj, model.proj.quantized), (model.lm_head, model.lm_head_quantized)):
        assert blocks.qtype == "Q8_0" and torch.equal(holder.weight.data, dequantize(blocks))
    assert model.odd.quantized is None and torch.equal(model.odd.weight, odd_before)


def test_int8_without_the_native_kernels_is_a_clear_error(tiny_model_dirs):
    with pytest.raises(ValueError, match="quantization int8 needs the native CPU kernels"):
        LLM(model=tiny_model_dirs["llama"], dtype="float16", quantization="int8", kv_cache_memory=2**20)
