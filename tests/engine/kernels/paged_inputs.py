"""Random paged-cache inputs for the kernel tests: shuffled block tables, strided queries; the tolerance per dtype."""

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class PagedBatch:
    query: torch.Tensor  # [num_tokens, num_heads, head_dim], a strided view like the model's
    key_cache: torch.Tensor  # [num_blocks, block_size, num_kv_heads, head_dim]
    value_cache: torch.Tensor
    block_tables: torch.Tensor  # [num_seqs, max_blocks] int64, padded with block 0
    query_start_loc: torch.Tensor  # [num_seqs + 1] int32
    seq_lens: torch.Tensor  # [num_seqs] int32
    max_query_len: int


# Kernel against the float32 reference on the same rounded inputs. 16-bit kernels round their
# output and the softmax weights of P·V (relative 2^-8 in bf16, 2^-11 in fp16; outputs are O(1)).
TOLERANCE = {
    torch.float32: dict(atol=2e-5, rtol=1e-4),
    torch.bfloat16: dict(atol=2e-2, rtol=2e-2),
    torch.float16: dict(atol=4e-3, rtol=4e-3),
}


def paged_batch(
    seq_lens: list[int],
    query_lens: list[int],
    block_size: int,
    num_kv_heads: int,
    group: int,
    head_dim: int,
    dtype: torch.dtype = torch.float32,
    device: str = "cpu",
) -> PagedBatch:
    """Each sequence owns distinct blocks in shuffled order; unused cache slots hold noise.

    Drawn in float32 on the CPU whatever the dtype and device, so every device sees the same values."""
    torch.manual_seed(sum(seq_lens) + block_size + head_dim + group)
    blocks_per_seq = [-(-n // block_size) for n in seq_lens]
    num_blocks = sum(blocks_per_seq) + 3  # spare blocks that no table points at
    order = torch.randperm(num_blocks)
    tables = torch.zeros(len(seq_lens), max(blocks_per_seq), dtype=torch.int64)
    used = 0
    for i, n in enumerate(blocks_per_seq):
        tables[i, :n] = order[used : used + n]
        used += n
    cache_shape = (num_blocks, block_size, num_kv_heads, head_dim)
    num_heads = num_kv_heads * group
    num_tokens = sum(query_lens)
    fused = torch.randn(num_tokens, num_heads + 2 * num_kv_heads, head_dim)  # q, k, v heads side by side
    starts = torch.tensor([0, *query_lens], dtype=torch.int32).cumsum(0, dtype=torch.int32)
    key_cache, value_cache = torch.randn(cache_shape), torch.randn(cache_shape)
    fused, key_cache, value_cache = (t.to(device=device, dtype=dtype) for t in (fused, key_cache, value_cache))
    return PagedBatch(
        query=fused[:, :num_heads],
        key_cache=key_cache,
        value_cache=value_cache,
        block_tables=tables.to(device),
        query_start_loc=starts.to(device),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=device),
        max_query_len=max(query_lens),
    )


def in_float32(args: tuple) -> tuple:
    """The reference's inputs: float tensors upcast (the values the kernel read, exactly), the rest as is."""
    return tuple(a.float() if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args)
