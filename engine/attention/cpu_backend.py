"""The CPU attention backend: the PyTorch path with decode attention done natively.

Decode sequences go to the C++ kernel in one call (no padding, no gather copy);
prefill chunks take the same SDPA path as the PyTorch backend.
"""

import torch

from engine.attention.metadata import AttentionMetadata
from engine.attention.torch_backend import attend_prefills


def make_cpu_paged_attention(kernels):
    """Bind the compiled kernels into a function with the backend signature."""

    def paged_attention(
        query: torch.Tensor,  # [num_tokens, num_heads, head_dim]
        key: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
        value: torch.Tensor,
        key_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
        value_cache: torch.Tensor,
        meta: AttentionMetadata,
        scale: float,
    ) -> torch.Tensor:  # [num_tokens, num_heads, head_dim]
        kernels.write_kv_cache(key, value, key_cache, value_cache, meta.slot_mapping)
        nd = meta.num_decodes
        if nd == meta.num_seqs:  # decode-only step: no output assembly needed
            return kernels.paged_decode_attention(query, key_cache, value_cache, meta.block_tables, meta.seq_lens, scale)
        out = torch.empty_like(query)
        if nd:
            out[:nd] = kernels.paged_decode_attention(
                query[:nd], key_cache, value_cache, meta.block_tables[:nd], meta.seq_lens[:nd], scale
            )
        attend_prefills(out, query, key_cache, value_cache, meta, scale, key, value)
        return out

    return paged_attention
