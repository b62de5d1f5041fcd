"""The CPU attention backend: native kernels that read the paged cache in place, where they are faster.

Decode sequences go to the C++ decode kernel in one call (no padding, no gather copy). Prefill chunks
go to the C++ prefill kernel, all in one call, or to the PyTorch backend's SDPA path, per band of chunk
lengths as timed on this machine (`prefill_choice`).
"""

from __future__ import annotations

from typing import Sequence

import torch

from engine.attention.metadata import AttentionMetadata
from engine.attention.torch_backend import attend_prefills
from engine.layers.linear_choice import BANDS, band_of


def prefill_impls(kernels) -> dict:
    """name -> a prefill implementation with the signature `prefill_choice` times (it fills out's rows of
    the sequences `seqs`); the step's new `key`/`value` let SDPA skip gathering a prefix-less chunk's K/V."""

    def native(out, query, key_cache, value_cache, meta: AttentionMetadata, scale: float, seqs, key=None,
               value=None) -> None:  # fmt: skip
        ids = torch.as_tensor(seqs, dtype=torch.int64)
        kernels.paged_prefill_attention(query, key_cache, value_cache, meta.block_tables, meta.seq_lens,
                                        meta.query_start_loc, ids, scale, out)  # fmt: skip

    def sdpa(out, query, key_cache, value_cache, meta: AttentionMetadata, scale: float, seqs, key=None,
             value=None) -> None:  # fmt: skip
        attend_prefills(out, query, key_cache, value_cache, meta, scale, key, value, seqs=seqs)

    return {"native": native, "sdpa": sdpa}


class PrefillSplit:
    """Which prefill chunks of a step each implementation runs: worked out once per step (the metadata
    object is the step's), used by every layer."""

    def __init__(self, by_band: Sequence[str]):
        self.by_band = tuple(by_band)
        self._meta: AttentionMetadata | None = None
        self._split: dict[str, torch.Tensor | list[int]] = {}

    def of(self, meta: AttentionMetadata) -> dict[str, torch.Tensor | list[int]]:
        if meta is not self._meta:
            starts, split = meta.query_start_loc_host, {}
            for i in range(meta.num_decodes, meta.num_seqs):
                split.setdefault(self.by_band[band_of(starts[i + 1] - starts[i])], []).append(i)
            if "native" in split:  # the kernel takes them as a tensor
                split["native"] = torch.tensor(split["native"], dtype=torch.int64)
            self._meta, self._split = meta, split
        return self._split


def make_cpu_paged_attention(kernels, prefill_by_band: Sequence[str] = ("native",) * len(BANDS)):
    """Bind the compiled kernels into a function with the backend signature; `prefill_by_band` names the
    prefill implementation ("native" or "sdpa") for each band of chunk lengths (`linear_choice.BANDS`)."""
    split, prefill = PrefillSplit(prefill_by_band), prefill_impls(kernels)

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
        for name, seqs in split.of(meta).items():
            prefill[name](out, query, key_cache, value_cache, meta, scale, seqs, key, value)
        return out

    return paged_attention
