"""Paged attention in plain PyTorch: the CPU path and the reference for the kernels.

Decode sequences (one query each) run as one batched SDPA call over K/V
gathered from their block tables. Each prefill chunk runs as one SDPA call
over its cached prefix plus its new tokens. The loop is per prefill sequence,
never per token.
"""

from typing import Iterable

import torch
import torch.nn.functional as F

from engine.attention.metadata import AttentionMetadata


def write_kv_cache(
    key: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    value: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    key_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,  # [num_tokens], -1 = skip
    all_slots_valid: bool = False,
) -> None:
    if not all_slots_valid:
        keep = slot_mapping >= 0
        key, value, slot_mapping = key[keep], value[keep], slot_mapping[keep]
    flat_k = key_cache.view(-1, *key_cache.shape[2:])  # [num_blocks * block_size, kv_heads, dim]
    flat_v = value_cache.view(-1, *value_cache.shape[2:])
    flat_k.index_copy_(0, slot_mapping, key)
    flat_v.index_copy_(0, slot_mapping, value)


def gather_kv(cache: torch.Tensor, block_table: torch.Tensor, num_tokens: int) -> torch.Tensor:
    """K or V of one sequence's first `num_tokens` tokens: [num_tokens, num_kv_heads, head_dim]."""
    block_size = cache.shape[1]
    num_blocks = (num_tokens + block_size - 1) // block_size
    blocks = cache.index_select(0, block_table[:num_blocks])  # [n, block_size, kv_heads, dim]
    return blocks.flatten(0, 1)[:num_tokens]


def gather_padded_kv(cache: torch.Tensor, tables: torch.Tensor, max_len: int) -> torch.Tensor:
    """K or V of several sequences, padded: [num_seqs, max_len, num_kv_heads, head_dim].

    index_select over whole blocks is a few times faster than advanced indexing.
    """
    n, num_blocks = tables.shape
    blocks = cache.index_select(0, tables.flatten())  # [n * num_blocks, block_size, kv_heads, dim]
    return blocks.view(n, num_blocks * cache.shape[1], *cache.shape[2:])[:, :max_len]


def paged_attention(
    query: torch.Tensor,  # [num_tokens, num_heads, head_dim]
    key: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    value: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    key_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    value_cache: torch.Tensor,
    meta: AttentionMetadata,
    scale: float,
) -> torch.Tensor:  # [num_tokens, num_heads, head_dim]
    write_kv_cache(key, value, key_cache, value_cache, meta.slot_mapping, meta.all_slots_valid)
    out = torch.empty_like(query)
    for first, end, tables, mask in meta.decode_groups:
        out[first:end] = _decode(query[first:end], key_cache, value_cache, tables, mask, scale)
    attend_prefills(out, query, key_cache, value_cache, meta, scale, key, value)
    return out


def attend_prefills(out, query, key_cache, value_cache, meta: AttentionMetadata, scale: float, key=None, value=None,
                    seqs: Iterable[int] | None = None):
    """Fill `out` for every prefill chunk (the sequences after the decodes, or those of `seqs`), one SDPA call each.

    With the step's new `key`/`value` given and every slot written this step, a
    chunk with no cached prefix attends to them directly instead of gathering the
    same rows back from the cache.
    """
    use_new_kv = key is not None and meta.all_slots_valid
    for i in range(meta.num_decodes, meta.num_seqs) if seqs is None else seqs:
        start, end = meta.query_start_loc_host[i], meta.query_start_loc_host[i + 1]
        new_kv = None
        if use_new_kv and meta.seq_lens_host[i] == end - start:
            new_kv = (key[start:end], value[start:end])
        out[start:end] = prefill_attention(query[start:end], key_cache, value_cache, meta, i, scale, new_kv)


def _decode(q, key_cache, value_cache, tables, mask, scale: float) -> torch.Tensor:
    # q: [nd, heads, dim]; tables: [nd, blocks]; mask: [nd, 1, 1, max_len]
    nd, num_heads, dim = q.shape
    num_kv_heads = key_cache.shape[2]
    max_len = mask.shape[-1]
    k = gather_padded_kv(key_cache, tables, max_len)  # [nd, max_len, kv_heads, dim]
    v = gather_padded_kv(value_cache, tables, max_len)
    # The query heads that share a KV head become that head's query rows, so
    # attention is one plain (non-GQA) call with group-size queries per KV head.
    out = F.scaled_dot_product_attention(
        q.view(nd, num_kv_heads, num_heads // num_kv_heads, dim),  # [nd, kv_heads, group, dim]
        k.transpose(1, 2),  # [nd, kv_heads, max_len, dim]
        v.transpose(1, 2),
        attn_mask=mask,
        scale=scale,
    )
    return out.reshape(nd, num_heads, dim)


def prefill_attention(q, key_cache, value_cache, meta: AttentionMetadata, i: int, scale: float, new_kv=None):
    """Sequence i's query chunk against its cached prefix plus itself, causally.

    new_kv: the chunk's own (K, V) when it has no cached prefix, else None (read from the cache).
    """
    num_q = q.shape[0]
    ctx = meta.seq_lens_host[i]
    if new_kv is not None:
        k, v = new_kv  # [ctx, kv_heads, dim]
    else:
        k = gather_kv(key_cache, meta.block_tables[i], ctx)  # [ctx, kv_heads, dim]
        v = gather_kv(value_cache, meta.block_tables[i], ctx)
    if ctx == num_q:
        mask, causal = None, True  # no cached prefix: plain causal, the fastest kernel
    else:
        # Query j sits at position ctx - num_q + j and sees keys up to and including it.
        q_pos = torch.arange(ctx - num_q, ctx, device=q.device)
        mask, causal = torch.arange(ctx, device=q.device)[None, :] <= q_pos[:, None], False  # [num_q, ctx]
    # 4-D inputs (a batch of one) take torch's fast CPU flash kernel; 3-D ones do not.
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1)[None],  # [1, heads, num_q, dim]
        k.transpose(0, 1)[None],  # [1, kv_heads, ctx, dim]
        v.transpose(0, 1)[None],
        attn_mask=mask,
        is_causal=causal,
        scale=scale,
        enable_gqa=True,
    )
    return out[0].transpose(0, 1)
