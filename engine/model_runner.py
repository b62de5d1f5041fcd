"""Owns the model weights and the KV cache tensors; runs one forward per step.

`execute(batch)` takes the flattened ragged batch of one step (prefill
chunks and decode tokens mixed) and returns the sampled tokens of the
sequences whose last token was in it.
"""

from __future__ import annotations

import logging
import time

import torch

from engine.attention import select_backend
from engine.config import EngineConfig
from engine.layers.ops import layer_ops
from engine.layers.rotary import RotaryEmbedding
from engine.kv_cache import allocate_kv_caches, num_blocks_for
from engine.model_input import ModelInput
from engine.models import MODEL_REGISTRY
from engine.sampler import Sampler, SamplerOutput
from engine.weight_loader import load_weights

logger = logging.getLogger("tandem.engine")


def load_model(config: EngineConfig, show_progress: bool = True) -> torch.nn.Module:
    cls = MODEL_REGISTRY[config.model.architecture]
    start = time.perf_counter()
    # Built on the meta device: no time spent on random init of weights we overwrite.
    with torch.device("meta"):
        model = cls(config.model, max_positions=config.scheduler.max_model_len).to(config.dtype)
    model = model.to_empty(device=config.device).eval()
    model.tie_weights()  # to_empty() gives each parameter its own storage
    _rebuild_rotary_tables(model, config)
    load_weights(model, config.model_dir, show_progress=show_progress)
    model.ops = layer_ops(config.device, config.dtype)
    logger.info(
        "loaded %s from %s in %.1fs (%s layer ops)",
        config.model.architecture, config.model_dir, time.perf_counter() - start, model.ops.name,
    )
    return model


def _rebuild_rotary_tables(model: torch.nn.Module, config: EngineConfig) -> None:
    # cos/sin stay float32, as in transformers; they are cast where they are used.
    fresh = RotaryEmbedding(
        config.model.head_dim, config.scheduler.max_model_len, config.model.rope_theta, config.model.rope_scaling
    ).to(config.device)
    model.rotary.cos_cached, model.rotary.sin_cached = fresh.cos_cached, fresh.sin_cached


class ModelRunner:
    def __init__(self, config: EngineConfig, show_progress: bool = True):
        self.config = config
        self.model = load_model(config, show_progress)
        self.num_blocks = num_blocks_for(config.model, config.cache, config.dtype, config.device)
        self.kv_caches = allocate_kv_caches(
            config.model, self.num_blocks, config.cache.block_size, config.dtype, config.device
        )
        self.attn_fn = select_backend(config.attention_backend, config.device)
        self.sampler = Sampler()

    @torch.inference_mode()
    def compute_logits(self, batch: ModelInput) -> torch.Tensor:
        """Float32 logits of the sampling rows: [num_sampling, vocab_size].

        Sampling always works in float32 (as vLLM's does); for bfloat16 models the
        cast also makes the argmax several times faster on CPU.
        """
        hidden = self.model(batch.input_ids, batch.positions, self.kv_caches, batch.meta, self.attn_fn)
        return self.model.compute_logits(hidden[batch.logits_indices]).float()

    @torch.inference_mode()
    def execute(self, batch: ModelInput) -> SamplerOutput:
        logits = self.compute_logits(batch)
        if not batch.sampling_states:
            return SamplerOutput(token_ids=[], logprobs=[])
        return self.sampler(logits, batch.sampling_states)
