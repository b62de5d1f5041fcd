"""A float checkpoint's linear weights quantized to int8 at load (`--quantization int8`): Q8_0 blocks, a scale
per 32 weights of a row, then served by the same kernels as a GGUF file's blocks (`engine.quantized_weight`).

    attached = quantize_linears(model)  # after load_weights (and attach_gguf_blocks); {"Q8_0": count}

Q8_0 is finer than one scale per output channel (vLLM's and SGLang's w8a8 int8): a block's scale follows its
own 32 weights. A decode step reads 36 bytes for 32 weights (the float16 scale widened to float32 once) against
bfloat16's 64 and float32's 128. Each weight is the nearest code of its block's scale, max |w| / 127 in float16, as
llama.cpp's converter makes Q8_0. With the integer kernels (AVX512-VNNI) the activations are quantized too:
llama.cpp's arithmetic; `scripts/bench_accuracy.py` measures what it costs.

Who owns what: as for a GGUF model's blocks, each linear's blocks become `PreparedLinear.quantized` (its dense
parameter goes at `prepare`) and lm_head's `DecoderForCausalLM.lm_head_quantized` (a tied embedding stays
dense for its lookups, with the blocks' values). Weights already in a GGUF file's blocks keep them; a weight whose rows are not whole
blocks (in_features not a multiple of 32) stays dense.
"""

from __future__ import annotations

import torch

from engine.layers.linear import PreparedLinear
from engine.quantized_weight import BLOCK, QuantizedWeight, dequantize, quantize


def quantize_linears(model: torch.nn.Module) -> dict[str, int]:
    """Give each dense linear of `model` (this rank's shard, as loaded) and its lm_head Q8_0 blocks (module doc).
    Returns {"Q8_0": how many weights took them} (empty when none could)."""
    count = 0
    for module in model.modules():
        if isinstance(module, PreparedLinear) and module.quantized is None and _whole_blocks(module.weight):
            module.quantized = _blocks_of(module.weight)
            count += 1
    if model.lm_head_quantized is None and _whole_blocks(model.lm_head.weight):
        model.lm_head_quantized = _blocks_of(model.lm_head.weight)
        count += 1
    return {"Q8_0": count} if count else {}


def _blocks_of(weight: torch.nn.Parameter) -> QuantizedWeight:
    """`weight` in Q8_0 blocks, and its values made the blocks' (in place): a band of rows whose kernel the
    timing gives to a dense form reads those, so every band computes the same model (a tied embedding's
    lookups too, as a GGUF file's Q8_0 embedding gives them)."""
    blocks = quantize(weight.data, "Q8_0")
    weight.data.copy_(dequantize(blocks).to(weight.dtype))
    return blocks


def _whole_blocks(weight: torch.Tensor) -> bool:
    return weight.dim() == 2 and weight.shape[1] % BLOCK == 0
