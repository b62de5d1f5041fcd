"""A linear weight kept in the blocks a GGUF file ships it in, not widened to a float type.

    weight = QuantizedWeight.from_gguf_rows("Q4_1", raw)   # raw: uint8 [out, bytes of a row's blocks]
    dense = dequantize(weight)                             # float32 [out, in]: the reference

Every type here cuts a row of `in` weights into blocks of 32, each with its own scale `d` (and, for Q4_1, its
own offset `m`); a weight is `d * q` (Q8_0: q an int8), `d * (q - 8)` (Q4_0: q a 4-bit code) or `d * q + m`
(Q4_1). The values are those of ggml's reference dequantisation (the `gguf` library's, which transformers
uses to convert a GGUF file): computed in float32 from the float16 scales, so `dequantize` of a loaded
weight equals the converted checkpoint's tensor bit for bit.

In the file a block is its scales followed by its codes; here the codes and the scales are split into
arrays of their own, so that a kernel reads each as a plain stream and a tensor-parallel shard is a slice
of rows (or of whole blocks of columns). A 4-bit block keeps ggml's order: byte j holds the codes of weight
j (low nibble) and weight j + 16 (high nibble).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

BLOCK = 32  # weights per block, in every type here
_CODE_BYTES = {"Q8_0": 32, "Q4_0": 16, "Q4_1": 16}  # code bytes per block
_SCALE_BYTES = {"Q8_0": 2, "Q4_0": 2, "Q4_1": 4}  # float16 d (and m) per block, ahead of the codes in a file
QTYPES = tuple(_CODE_BYTES)


def check_qtype(qtype: str) -> None:
    """ValueError naming the supported types, for a type this module has no layout for."""
    if qtype not in QTYPES:
        raise ValueError(f"quantized weights of type {qtype!r} are not supported (only {', '.join(QTYPES)})")


@dataclass(frozen=True, eq=False)
class QuantizedWeight:
    """A [out, in] linear weight as blocks of 32 along `in` (see the module doc for the types)."""

    qtype: str  # "Q8_0", "Q4_0" or "Q4_1"
    codes: torch.Tensor  # Q8_0: int8 [out, in]; Q4_*: uint8 [out, in / 2], two codes a byte
    scales: torch.Tensor  # float16 [out, in / 32]: d of each block (float32 in `for_kernels`' copy)
    offsets: torch.Tensor | None = None  # the same for m of each block (Q4_1); None otherwise

    def __post_init__(self):
        check_qtype(self.qtype)
        if (self.offsets is not None) != (self.qtype == "Q4_1"):
            raise ValueError(f"{self.qtype}: offsets are for Q4_1 only, and Q4_1 needs them")

    @property
    def out_features(self) -> int:
        return self.codes.shape[0]

    @property
    def in_features(self) -> int:
        return self.scales.shape[1] * BLOCK

    @property
    def shape(self) -> tuple[int, int]:
        return self.out_features, self.in_features

    @property
    def nbytes(self) -> int:
        """The bytes a product reads: codes and scales (what a decode step streams from memory)."""
        return sum(t.numel() * t.element_size() for t in (self.codes, self.scales, self.offsets) if t is not None)

    @classmethod
    def from_gguf_rows(cls, qtype: str, raw: np.ndarray | torch.Tensor) -> "QuantizedWeight":
        """The weight from a GGUF tensor's bytes: uint8 [out, blocks of a row x bytes per block]."""
        check_qtype(qtype)
        # a copy: a reader's array maps the file read-only
        raw = torch.from_numpy(np.array(raw, dtype=np.uint8)) if isinstance(raw, np.ndarray) else raw.contiguous()
        block_bytes = _SCALE_BYTES[qtype] + _CODE_BYTES[qtype]
        if raw.dtype != torch.uint8 or raw.dim() != 2 or raw.shape[1] % block_bytes:
            raise ValueError(f"{qtype}: expected uint8 [out, a multiple of {block_bytes} bytes], got "
                             f"{raw.dtype} {list(raw.shape)}")  # fmt: skip
        blocks = raw.view(raw.shape[0], -1, block_bytes)  # [out, blocks, bytes of one]
        halves = blocks[:, :, : _SCALE_BYTES[qtype]].contiguous().view(torch.float16)  # [out, blocks, 1 or 2]
        codes = blocks[:, :, _SCALE_BYTES[qtype] :].reshape(raw.shape[0], -1)
        if qtype == "Q8_0":
            codes = codes.view(torch.int8)
        offsets = halves[:, :, 1].contiguous() if qtype == "Q4_1" else None
        return cls(qtype, codes.contiguous(), halves[:, :, 0].contiguous(), offsets)

    def for_kernels(self) -> "QuantizedWeight":
        """The same weight with its scales (and offsets) widened to float32, as the native kernels take them:
        exact, 4 bytes more a block (quantized_linear.cpp says why)."""
        offsets = None if self.offsets is None else self.offsets.float()
        return QuantizedWeight(self.qtype, self.codes, self.scales.float(), offsets)

    def rows(self, start: int, stop: int) -> "QuantizedWeight":
        """Output features [start, stop): a column-parallel shard."""
        return self._map(lambda t: t[start:stop])

    def columns(self, start: int, stop: int) -> "QuantizedWeight":
        """Input features [start, stop), which must be whole blocks: a row-parallel shard."""
        if start % BLOCK or stop % BLOCK:
            raise ValueError(f"{self.qtype}: columns [{start}, {stop}) cut a block of {BLOCK}")
        per_byte = 1 if self.qtype == "Q8_0" else 2  # codes a byte
        return QuantizedWeight(self.qtype, self.codes[:, start // per_byte : stop // per_byte].contiguous(),
                               self.scales[:, start // BLOCK : stop // BLOCK].contiguous(),
                               None if self.offsets is None else
                               self.offsets[:, start // BLOCK : stop // BLOCK].contiguous())  # fmt: skip

    def permuted_rows(self, order: torch.Tensor) -> "QuantizedWeight":
        """Row i of the result is row order[i] of this weight."""
        return self._map(lambda t: t[order])

    @staticmethod
    def cat(parts: list["QuantizedWeight"]) -> "QuantizedWeight":
        """The parts' rows one after the other (a fused q|k|v or gate|up); they must share type and width."""
        first = parts[0]
        if any(p.qtype != first.qtype or p.in_features != first.in_features for p in parts):
            raise ValueError("fused parts of different quantized types or widths: "
                             + ", ".join(f"{p.qtype} {list(p.shape)}" for p in parts))  # fmt: skip
        offsets = None if first.offsets is None else torch.cat([p.offsets for p in parts])
        return QuantizedWeight(first.qtype, torch.cat([p.codes for p in parts]),
                               torch.cat([p.scales for p in parts]), offsets)  # fmt: skip

    def _map(self, take) -> "QuantizedWeight":
        offsets = None if self.offsets is None else take(self.offsets).contiguous()
        return QuantizedWeight(self.qtype, take(self.codes).contiguous(), take(self.scales).contiguous(), offsets)


def codes_as_float(weight: QuantizedWeight) -> torch.Tensor:
    """The codes of every block in weight order, as float32 [out, blocks, 32] (Q4_0's without its -8)."""
    out, blocks = weight.scales.shape
    if weight.qtype == "Q8_0":
        return weight.codes.view(out, blocks, BLOCK).float()
    packed = weight.codes.view(out, blocks, BLOCK // 2)
    return torch.cat([packed & 0x0F, packed >> 4], dim=-1).float()  # weights j and j + 16 share byte j


def dequantize(weight: QuantizedWeight) -> torch.Tensor:
    """float32 [out, in]: ggml's reference values (module doc), in its order of operations."""
    q = codes_as_float(weight)  # [out, blocks, 32]
    d = weight.scales.float()[:, :, None]
    if weight.qtype == "Q4_0":
        q = q - 8
    values = d * q
    if weight.offsets is not None:
        values = values + weight.offsets.float()[:, :, None]
    return values.reshape(weight.out_features, weight.in_features)


def quantize_activations(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [rows, in] per block of 32 as int8 codes and float32 scales ([rows, blocks, 32], [rows, blocks]):
    d = max |x| / 127, q = round(x * (127 / max |x|)) to nearest even (0 where a block is all zero), as
    quantized_panels.cpp quantizes the activations of its integer products."""
    rows, inp = x.shape
    blocks = x.detach().float().reshape(rows, inp // BLOCK, BLOCK)
    peak = blocks.abs().amax(-1)
    inverse = torch.where(peak > 0, 127 / peak, torch.zeros_like(peak))
    return (blocks * inverse[..., None]).round().to(torch.int8), peak / 127


def int8_activation_linear(x: torch.Tensor, weight: QuantizedWeight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """The reference of quantized_panels.cpp: x [rows, in] @ weight.T with x quantized per block
    (`quantize_activations`), each block's product an exact integer sum scaled by both scales (float64 here;
    the kernel sums in float32). float32 [rows, out]."""
    q, d = quantize_activations(x)  # [rows, blocks, 32], [rows, blocks]
    codes = codes_as_float(weight).double()  # [out, blocks, 32], Q4_0's without its -8
    integer = torch.einsum("rbj,obj->rob", q.double(), codes)  # [rows, out, blocks]
    w_scales = weight.scales.double()  # [out, blocks]
    y = (integer * w_scales[None] * d.double()[:, None]).sum(-1)
    code_sums = d.double() * q.double().sum(-1)  # [rows, blocks]: the activations' block sums
    if weight.qtype == "Q4_1":
        y = y + code_sums @ weight.offsets.double().T
    elif weight.qtype == "Q4_0":
        y = y - 8 * code_sums @ w_scales.T
    if bias is not None:
        y = y + bias.double()
    return y.float()


def quantize(dense: torch.Tensor, qtype: str) -> QuantizedWeight:
    """`dense` [out, in] (in a multiple of 32) in blocks of `qtype`, each weight the nearest code (the scales
    are not chosen as carefully as llama.cpp's quantiser chooses them): for tests and for timing kernels on
    the model's shapes, not for serving."""
    check_qtype(qtype)
    out, inp = dense.shape
    if inp % BLOCK:
        raise ValueError(f"in_features {inp} is not a multiple of {BLOCK}")
    x = dense.detach().float().reshape(out, inp // BLOCK, BLOCK)
    if qtype == "Q4_1":
        low, high = x.amin(-1), x.amax(-1)
        d = ((high - low) / 15).half()
        inverse = torch.where(d.float() > 0, 1 / d.float(), torch.zeros_like(low))
        q = ((x - low.half().float()[..., None]) * inverse[..., None]).round().clamp(0, 15).to(torch.uint8)
        return QuantizedWeight(qtype, _pack_nibbles(q), d, low.half())
    peak = x.abs().amax(-1)
    if qtype == "Q8_0":
        d = (peak / 127).half()
        inverse = torch.where(d.float() > 0, 1 / d.float(), torch.zeros_like(peak))
        q = (x * inverse[..., None]).round().clamp(-127, 127).to(torch.int8)
        return QuantizedWeight(qtype, q.reshape(out, inp).contiguous(), d)
    # Q4_0, as ggml: the weight of largest size is code 0 exactly (-8 d), signs either way
    extreme = x.gather(-1, x.abs().argmax(-1, keepdim=True))[..., 0]
    d = (extreme / -8).half()
    inverse = torch.where(d.float() != 0, 1 / d.float(), torch.zeros_like(peak))
    q = (x * inverse[..., None] + 8).round().clamp(0, 15).to(torch.uint8)
    return QuantizedWeight(qtype, _pack_nibbles(q), d)


def _pack_nibbles(q: torch.Tensor) -> torch.Tensor:
    """uint8 codes [out, blocks, 32] -> [out, blocks * 16]: byte j = code j | code j + 16 << 4."""
    packed = q[..., : BLOCK // 2] | (q[..., BLOCK // 2 :] << 4)
    return packed.reshape(q.shape[0], -1).contiguous()
