"""Rank 0 sends each step's batch to the other tensor-parallel ranks; they rebuild it.

One step is three broadcasts from rank 0, all ranks calling them in the same order:

    1. header length   int64[1]               cpu group
    2. header          msgpack bytes, uint8   cpu group   (StepHeader or Shutdown)
    3. payload         int64[3*T + S*W]       device group: input_ids | positions |
                                                slot_mapping | block_tables (S x W)

Followers need no sampling state (rank 0 alone samples), so the header carries
only shapes and the attention metadata's host tuples (`wire.step`, the one codec, never pickle).
`attachment` is opaque bytes for the layer above the engine (a prefill worker
tells its followers which KV transfers this step starts); the engine never reads it.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from engine.attention import AttentionMetadata
from engine.model_input import ModelInput
from engine.parallel.group import TPGroup
from wire import codec
from wire.step import Shutdown, StepHeader

SRC = 0


class StepSender:
    """Rank 0's side: `send(batch)` before its own forward, `shutdown()` once at the end."""

    def __init__(self, tp: TPGroup):
        self.tp = tp

    def send(self, batch: ModelInput, attachment: bytes = b"") -> None:
        meta = batch.meta
        header = StepHeader(
            num_tokens=batch.input_ids.shape[0],
            num_decodes=meta.num_decodes,
            table_width=meta.block_tables.shape[1],
            query_start_loc=meta.query_start_loc_host,
            seq_lens=meta.seq_lens_host,
            block_size=meta.block_size,
            all_slots_valid=meta.all_slots_valid,
            attachment=attachment,
        )
        self._send_header(header)
        payload = torch.cat((batch.input_ids, batch.positions, meta.slot_mapping, meta.block_tables.flatten()))
        dist.broadcast(payload, SRC, group=self.tp.device_group)

    def shutdown(self) -> None:
        self._send_header(Shutdown())

    def _send_header(self, message: StepHeader | Shutdown) -> None:
        data = torch.frombuffer(bytearray(codec.encode(message)), dtype=torch.uint8)
        dist.broadcast(torch.tensor([data.numel()], dtype=torch.int64), SRC, group=self.tp.cpu_group)
        dist.broadcast(data, SRC, group=self.tp.cpu_group)


class StepReceiver:
    """A follower's side: `recv()` is the next step's batch and attachment, or None once rank 0 shuts down."""

    def __init__(self, tp: TPGroup, device: str):
        self.tp, self.device = tp, device

    def recv(self) -> tuple[ModelInput, bytes] | None:
        header = self._recv_header()
        if isinstance(header, Shutdown):
            return None
        t, num_seqs = header.num_tokens, len(header.seq_lens)
        payload = torch.empty(3 * t + num_seqs * header.table_width, dtype=torch.int64, device=self.device)
        dist.broadcast(payload, SRC, group=self.tp.device_group)
        meta = AttentionMetadata(
            slot_mapping=payload[2 * t : 3 * t],
            query_start_loc=torch.tensor(header.query_start_loc, dtype=torch.int32, device=self.device),
            seq_lens=torch.tensor(header.seq_lens, dtype=torch.int32, device=self.device),
            block_tables=payload[3 * t :].view(num_seqs, header.table_width),
            num_decodes=header.num_decodes,
            query_start_loc_host=header.query_start_loc,
            seq_lens_host=header.seq_lens,
            block_size=header.block_size,
            all_slots_valid=header.all_slots_valid,
        )
        no_rows = torch.empty(0, dtype=torch.int64, device=self.device)
        batch = ModelInput(payload[:t], payload[t : 2 * t], meta, logits_indices=no_rows, sampling_states=[])
        return batch, header.attachment

    def _recv_header(self) -> StepHeader | Shutdown:
        length = torch.empty(1, dtype=torch.int64)
        dist.broadcast(length, SRC, group=self.tp.cpu_group)
        data = torch.empty(int(length.item()), dtype=torch.uint8)
        dist.broadcast(data, SRC, group=self.tp.cpu_group)
        return codec.decode(data.numpy().tobytes(), (StepHeader, Shutdown))
