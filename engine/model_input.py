"""Build the flattened ragged batch (no padding) from the scheduler's decisions."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from engine.attention import AttentionMetadata
from engine.prompt_logprobs import PromptSpan, prompt_span
from engine.sampler import SamplingState
from engine.scheduler import ScheduledRequest


@dataclass(frozen=True)
class ModelInput:
    input_ids: torch.Tensor  # [num_tokens] int64
    positions: torch.Tensor  # [num_tokens] int64
    meta: AttentionMetadata
    logits_indices: torch.Tensor  # [num_sampling] int64, last token of each sequence that samples
    sampling_states: list[SamplingState]  # one per sampling sequence, same order as logits_indices
    prompt_spans: tuple[PromptSpan, ...] = ()  # rows that score prompt tokens (params.prompt_logprobs)


def build_model_input(scheduled: list[ScheduledRequest], block_size: int, device: str) -> ModelInput:
    ids, positions, slots, tables = [], [], [], []
    query_start, seq_lens, logits_indices, states = [0], [], [], []
    num_decodes, spans = 0, []
    for index, s in enumerate(scheduled):
        req, start = s.request, s.request.num_computed_tokens
        end = start + s.num_new_tokens
        block_ids = np.fromiter((b.block_id for b in req.blocks), dtype=np.int64, count=len(req.blocks))
        pos = np.arange(start, end, dtype=np.int64)
        ids.append(_token_slice(req, start, end))
        positions.append(pos)
        slots.append(block_ids[pos // block_size] * block_size + pos % block_size)
        tables.append(block_ids)
        query_start.append(query_start[-1] + s.num_new_tokens)
        seq_lens.append(end)
        num_decodes += s.is_decode
        top = req.params.prompt_logprobs
        if top is not None and start < req.num_prompt_tokens:
            span = prompt_span(index, query_start[-2], req.prompt_token_ids, start, end, top)
            spans += [span] if span is not None else []
        if s.samples:
            logits_indices.append(query_start[-1] - 1)
            states.append(req.sampling)
    slot_mapping = np.concatenate(slots)
    meta = AttentionMetadata(
        slot_mapping=_tensor(slot_mapping, device),
        query_start_loc=torch.tensor(query_start, dtype=torch.int32, device=device),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=device),
        block_tables=_tensor(_pad_tables(tables), device),
        num_decodes=num_decodes,
        query_start_loc_host=tuple(query_start),
        seq_lens_host=tuple(seq_lens),
        block_size=block_size,
        all_slots_valid=bool((slot_mapping >= 0).all()),
    )
    return ModelInput(
        input_ids=_tensor(np.concatenate(ids), device),
        positions=_tensor(np.concatenate(positions), device),
        meta=meta,
        logits_indices=torch.tensor(logits_indices, dtype=torch.int64, device=device),
        sampling_states=states,
        prompt_spans=tuple(spans),
    )


def _token_slice(req, start: int, end: int) -> np.ndarray:
    n_prompt = req.num_prompt_tokens
    if start >= n_prompt:
        return np.asarray(req.output_token_ids[start - n_prompt : end - n_prompt], dtype=np.int64)
    if end <= n_prompt:
        return np.asarray(req.prompt_token_ids[start:end], dtype=np.int64)
    return np.asarray(req.all_token_ids[start:end], dtype=np.int64)


def _pad_tables(tables: list[np.ndarray]) -> np.ndarray:
    width = max(len(t) for t in tables)
    out = np.zeros((len(tables), width), dtype=np.int64)
    for i, t in enumerate(tables):
        out[i, : len(t)] = t
    return out


def _tensor(a: np.ndarray, device: str) -> torch.Tensor:
    return torch.from_numpy(a).to(device)
