"""The flattened ragged batch as attention sees it.

Sequences are ordered decodes first, then prefill chunks, so each kind is one
contiguous slice of the token axis:

    tokens:  [ d0 d1 d2 | p0 p0 p0 p0 | p1 p1 ]
              decodes    prefill 0      prefill 1
"""

from dataclasses import dataclass
from functools import cached_property

import torch

DECODE_GROUP_SIZE = 16


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

    block_size: int = 16
    all_slots_valid: bool = True  # no -1 in slot_mapping: the cache write needs no filtering

    @property
    def num_seqs(self) -> int:
        return len(self.seq_lens_host)

    @property
    def max_seq_len(self) -> int:
        return max(self.seq_lens_host, default=0)

    @cached_property
    def max_decode_seq_len(self) -> int:
        return max(self.seq_lens_host[: self.num_decodes], default=0)

    @cached_property
    def max_prefill_query_len(self) -> int:
        starts = self.query_start_loc_host
        return max((starts[i + 1] - starts[i] for i in range(self.num_decodes, self.num_seqs)), default=0)

    @cached_property
    def decode_groups(self) -> list[tuple[int, int, torch.Tensor, torch.Tensor]]:
        """Decode sequences in groups padded to their own longest member.

        Built once per step and shared by every layer. Each entry is
        (first, end, tables [n, blocks], mask [n, 1, 1, max_len]) with True where
        a key is in context. The scheduler sorts decodes by length, so groups of
        neighbours waste little padding when lengths are spread.
        """
        groups = []
        for first in range(0, self.num_decodes, DECODE_GROUP_SIZE):
            end = min(first + DECODE_GROUP_SIZE, self.num_decodes)
            max_len = max(self.seq_lens_host[first:end])
            lens = self.seq_lens[first:end]
            mask = torch.arange(max_len, device=lens.device)[None, :] < lens[:, None]
            tables = self.block_tables[first:end, : -(-max_len // self.block_size)]
            groups.append((first, end, tables, mask[:, None, None, :]))
        return groups
