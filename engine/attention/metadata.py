"""The flattened ragged batch as attention sees it.

Sequences are ordered decodes first, then prefill chunks, so each kind is one
contiguous slice of the token axis:

    tokens:  [ d0 d1 d2 | p0 p0 p0 p0 | p1 p1 ]
              decodes    prefill 0      prefill 1
"""

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class AttentionMetadata:
    slot_mapping: torch.Tensor  # [num_tokens] int64, cache slot of each new token; -1 = do not write
    query_start_loc: torch.Tensor  # [num_seqs + 1] int32, token offset of each sequence's queries
    seq_lens: torch.Tensor  # [num_seqs] int32, tokens in context after this step (cached + new)
    block_tables: torch.Tensor  # [num_seqs, max_blocks] int64, padded with block 0 (masked out)
    num_decodes: int  # leading sequences that have exactly one query token
    # Host copies so the backend can slice without device syncs.
    query_start_loc_host: tuple[int, ...]
    seq_lens_host: tuple[int, ...]

    @property
    def num_seqs(self) -> int:
        return len(self.seq_lens_host)

    @property
    def max_seq_len(self) -> int:
        return max(self.seq_lens_host, default=0)
