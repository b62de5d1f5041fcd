"""Random paged-cache inputs for the kernel tests: shuffled block tables, strided queries."""

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


def paged_batch(
    seq_lens: list[int], query_lens: list[int], block_size: int, num_kv_heads: int, group: int, head_dim: int
) -> PagedBatch:
    """Each sequence owns distinct blocks in shuffled order; unused cache slots hold noise."""
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
    return PagedBatch(
        query=fused[:, :num_heads],
        key_cache=torch.randn(cache_shape),
        value_cache=torch.randn(cache_shape),
        block_tables=tables,
        query_start_loc=starts,
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
        max_query_len=max(query_lens),
    )
