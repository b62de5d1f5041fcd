"""A weight in GGUF blocks repacked into panels of 16 outputs, the form the integer kernel for many rows reads
(engine/native/csrc/quantized_panels.cpp, whose header gives the byte layout).

    panels = pack_int8_panels(weight)          # weight: engine.quantized_weight.QuantizedWeight
    y = kernels.quantized_panels_linear(x, panels.qtype, panels.codes, panels.scales, panels.extra,
                                        panels.out_features, bias)

In a panel, the codes of one block of 16 outputs lie so that 64 bytes hold 4 consecutive weights of each
output, one output per int32 lane: a VPDPBUSD with 4 activation codes broadcast adds their products to all
16 outputs at once. The codes are the file's (a Q4 panel keeps two codes a byte), so a panel reads the bytes
the blocks do, plus 4 bytes a block and output for Q8_0's code sums (the kernel's correction for taking the
activations unsigned).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.quantized_weight import BLOCK, QuantizedWeight, codes_as_float

PANEL = 16  # outputs per panel: one int32 lane of a 512-bit vector each
QUAD = 4  # weights per lane of one VPDPBUSD


@dataclass(frozen=True, eq=False)
class Int8Panels:
    qtype: str
    codes: torch.Tensor  # Q8_0: int8 [panels, blocks, 512]; Q4_*: uint8 [panels, blocks, 256]
    scales: torch.Tensor  # float32 [panels, blocks, 16]: d of each output's block (0 past out_features)
    extra: torch.Tensor | None  # Q4_1: offsets m, float32; Q8_0: 128 * code sums, int32; [panels, blocks, 16]
    out_features: int


def pack_int8_panels(weight: QuantizedWeight) -> Int8Panels:
    """`weight`'s blocks as panels (module doc); the values are untouched."""
    out, blocks = weight.scales.shape
    panels = -(-out // PANEL)

    def by_panel(per_block: torch.Tensor) -> torch.Tensor:
        """[out, blocks, ...] -> [panels, blocks, 16, ...], outputs past `out` zero."""
        padded = torch.zeros((panels * PANEL, *per_block.shape[1:]), dtype=per_block.dtype)
        padded[:out] = per_block
        return padded.reshape(panels, PANEL, *per_block.shape[1:]).transpose(1, 2).contiguous()

    q = by_panel(codes_as_float(weight).to(torch.int16))  # [panels, blocks, 16, 32]
    quads = q.reshape(panels, blocks, PANEL, BLOCK // QUAD, QUAD).transpose(2, 3)  # [.., 8 quads, 16, 4]
    scales = by_panel(weight.scales.float())
    if weight.qtype == "Q8_0":
        codes = quads.to(torch.int8).reshape(panels, blocks, -1).contiguous()
        return Int8Panels("Q8_0", codes, scales, (128 * q.sum(-1)).to(torch.int32), out)
    half = BLOCK // QUAD // 2  # quads 0-3 in the low nibbles, 4-7 (weights 16-31) in the high ones
    codes = (quads[:, :, :half] | (quads[:, :, half:] << 4)).to(torch.uint8).reshape(panels, blocks, -1).contiguous()
    extra = by_panel(weight.offsets.float()) if weight.qtype == "Q4_1" else None
    return Int8Panels(weight.qtype, codes, scales, extra, out)
