"""The step broadcast's header: rank 0 of a tensor-parallel worker to its followers (`engine.parallel.step_broadcast`).

Followers need no sampling state (rank 0 alone samples), so a header carries
only shapes and the attention metadata's host tuples; the token ids,
positions, slot mapping and block tables follow as one int64 tensor.
"""

from __future__ import annotations

from wire.codec import message


@message
class StepHeader:
    num_tokens: int
    num_decodes: int
    table_width: int  # columns of block_tables
    query_start_loc: tuple[int, ...]
    seq_lens: tuple[int, ...]
    block_size: int
    all_slots_valid: bool
    # Opaque to the engine: the layer above tells its followers what this step starts
    # (a prefill worker: which KV transfers, as `wire.ranks.ShardOrders`).
    attachment: bytes = b""


@message
class Shutdown:
    """Rank 0 is closing the engine: followers leave their loop."""
