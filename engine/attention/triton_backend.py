"""The Triton attention backend: the engine.kernels cache write, decode and prefill kernels.

One step's batch is decodes first, then prefill chunks (see metadata.py), so
each kernel gets one contiguous slice of the tokens and writes its slice of
the output in place: no padding, no copies.

On CUDA the kernels compile; on CPU they run only under triton's interpreter
(TRITON_INTERPRET=1, set before triton is imported), which the tests use.
Shapes the kernels cannot run are refused when the engine config is built.
"""

import os

import torch

from engine.attention.metadata import AttentionMetadata
from engine.kernels import SUPPORTED_BLOCK_SIZES, SUPPORTED_HEAD_DIMS


def check_triton_config(head_dim: int, block_size: int, dtype: torch.dtype, device: str) -> None:
    """Raise ValueError, naming the setting to change, when the Triton kernels cannot serve this config."""
    if head_dim not in SUPPORTED_HEAD_DIMS:
        raise ValueError(
            f"the Triton attention kernels need head_dim in {SUPPORTED_HEAD_DIMS}, the model has {head_dim}; "
            "use attention_backend='torch'"
        )
    if block_size not in SUPPORTED_BLOCK_SIZES:
        raise ValueError(f"the Triton attention kernels support block_size {SUPPORTED_BLOCK_SIZES}, got {block_size}")
    if device.startswith("cuda"):
        return
    if os.environ.get("TRITON_INTERPRET") != "1":
        raise ValueError(
            "attention_backend='triton' on CPU runs only under the Triton interpreter (TRITON_INTERPRET=1); "
            "use 'auto', 'cpu' or 'torch'"
        )
    if dtype != torch.float32:
        # The interpreter's tl.dot is wrong for 16-bit floats: refuse rather than answer wrongly.
        raise ValueError(f"the Triton interpreter needs dtype float32, got {dtype}")


def make_triton_paged_attention():
    """The backend function (signature of torch_backend.paged_attention); imports triton."""
    from engine.kernels.cache_write import reshape_and_cache
    from engine.kernels.decode_attention import paged_decode_attention
    from engine.kernels.prefill_attention import paged_prefill_attention

    def paged_attention(
        query: torch.Tensor,  # [num_tokens, num_heads, head_dim]
        key: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
        value: torch.Tensor,
        key_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
        value_cache: torch.Tensor,
        meta: AttentionMetadata,
        scale: float,
    ) -> torch.Tensor:  # [num_tokens, num_heads, head_dim]
        reshape_and_cache(key, value, key_cache, value_cache, meta.slot_mapping)
        out = torch.empty(query.shape, dtype=query.dtype, device=query.device)
        nd = meta.num_decodes  # decode sequences, and their tokens: one each
        if nd:
            paged_decode_attention(
                query[:nd],
                key_cache,
                value_cache,
                meta.block_tables[:nd],
                meta.seq_lens[:nd],
                scale,
                max_seq_len=meta.max_decode_seq_len,
                out=out[:nd],
            )
        if nd < meta.num_seqs:
            # Whole query and output: the chunks' query_start_loc entries index their rows.
            paged_prefill_attention(
                query,
                key_cache,
                value_cache,
                meta.block_tables[nd:],
                meta.query_start_loc[nd:],
                meta.seq_lens[nd:],
                meta.max_prefill_query_len,
                scale,
                out=out,
            )
        return out

    return paged_attention
