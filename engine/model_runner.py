"""Owns the model weights and the KV cache tensors; runs one forward per step.

`prepare(scheduled)` builds a step's flattened batch from the scheduler's decisions; `execute(batch)` takes the flattened ragged batch of one step (prefill
chunks and decode tokens mixed) and returns the sampled tokens of the
sequences whose last token was in it.

Tensor parallel (config.parallel.tp_size > 1): the runner joins the process
group, loads only its rank's shard and allocates only its KV heads. On rank 0
`execute` first broadcasts the batch; ranks > 0 (engine/parallel/follower.py)
`receive_step` and `forward`. `shutdown()` releases the group (rank 0 first
tells the followers to stop).
"""

from __future__ import annotations

import logging
import time
from typing import Callable, Protocol, Sequence

import torch
import torch.distributed as dist

from engine.attention import AttentionShapes, select_backend
from engine.config import EngineConfig
from engine.cpu_memory import keep_freed_memory
from engine.gguf_weights import attach_gguf_blocks
from engine.int8_weights import quantize_linears
from engine.kv_cache import allocate_kv_caches, num_blocks_for
from engine.layers.ops import layer_ops, native_kernels_for
from engine.layers.rotary import RotaryEmbedding
from engine.model_input import ModelInput, build_model_input
from engine.models import MODEL_REGISTRY
from engine.parallel.group import SINGLE, TPGroup, destroy_tp_group, init_tp_group
from engine.parallel.shard import num_kv_heads_per_rank
from engine.parallel.step_broadcast import StepReceiver, StepSender
from engine.prompt_logprobs import span_logprobs
from engine.sampler import Sampler, SamplerOutput
from engine.scheduler import ScheduledRequest
from engine.weight_loader import load_weights

logger = logging.getLogger("tandem.engine")

LayerDone = Callable[[int], None] | None


class StepRunner(Protocol):
    """What `LLMEngine` runs its steps on: a `ModelRunner`, or the planner's priced stand-in (`planner.sim`)."""

    num_blocks: int  # KV blocks the engine's block pool hands out

    def prepare(self, scheduled: Sequence[ScheduledRequest]):
        """The step's input (anything with `prompt_spans`), built before the request states move on."""

    def execute(self, batch, attachment: bytes = b"", layer_done: LayerDone = None) -> SamplerOutput: ...

    def shutdown(self) -> None: ...


def load_model(config: EngineConfig, show_progress: bool = True, tp: TPGroup = SINGLE) -> torch.nn.Module:
    """The model (this rank's shard of it under tensor parallelism) with its weights loaded."""
    cls = MODEL_REGISTRY[config.model.architecture]
    start = time.perf_counter()
    # Built on the meta device: no time spent on random init of weights we overwrite.
    with torch.device("meta"):
        model = cls(config.model, max_positions=config.scheduler.max_model_len, tp=tp).to(config.dtype)
    model = model.to_empty(device=config.device).eval()
    model.tie_weights()  # to_empty() gives each parameter its own storage
    _rebuild_rotary_tables(model, config)
    load_weights(model, config.model_dir, show_progress=show_progress)
    blocks = _quantized_blocks(model, config)
    int8_activations = config.quantization in ("auto", "int8")
    model.prepare(layer_ops(config.device, config.dtype, model.linear_shapes(), model.op_shapes(),
                            model.quantized_shapes(), int8_activations=int8_activations))  # fmt: skip
    logger.info(
        "loaded %s from %s in %.1fs (%s; %s layer ops)",
        config.model.architecture, config.model_dir, time.perf_counter() - start, blocks, model.ops.name,
    )
    return model


def _quantized_blocks(model: torch.nn.Module, config: EngineConfig) -> str:
    """Attach a GGUF model's quantized blocks to its linears where they are served so (`engine.gguf_weights`:
    on the CPU in float32 or bfloat16, with the native kernels built, unless quantization is "none"), and with
    quantization "int8" Q8_0 blocks to every other linear (`engine.int8_weights`); what was done, as text."""
    if config.quantization == "none":
        return "weights widened"
    if native_kernels_for(config.device, config.dtype) is None:
        if config.quantization == "int8":
            raise ValueError(f"quantization int8 needs the native CPU kernels (device cpu, dtype float32 or "
                             f"bfloat16, a C++ compiler, TANDEM_CPU_KERNELS not 0); here: device {config.device}, "
                             f"dtype {str(config.dtype).removeprefix('torch.')}")  # fmt: skip
        return "weights widened"
    attached = attach_gguf_blocks(model, config.model_dir)
    if config.quantization == "int8":
        for qtype, count in quantize_linears(model).items():
            attached[qtype] = attached.get(qtype, 0) + count
    if not attached:
        return "weights widened"
    return "in quantized blocks: " + ", ".join(f"{count} {qtype}" for qtype, count in sorted(attached.items()))


def _rebuild_rotary_tables(model: torch.nn.Module, config: EngineConfig) -> None:
    # cos/sin stay float32, as in transformers; they are cast where they are used.
    fresh = RotaryEmbedding(
        config.model.head_dim, config.scheduler.max_model_len, config.model.rope_theta, config.model.rope_scaling
    ).to(config.device)
    model.rotary.cos_cached, model.rotary.sin_cached = fresh.cos_cached, fresh.sin_cached


class ModelRunner:
    def __init__(self, config: EngineConfig, show_progress: bool = True):
        self.config = config
        if config.device == "cpu":
            keep_freed_memory()  # the steps' activations reuse pages instead of faulting in new ones
        self.tp = init_tp_group(config.parallel, config.device)
        self.model = load_model(config, show_progress, self.tp)
        kv_heads = num_kv_heads_per_rank(config.model.num_kv_heads, self.tp.size)
        self.num_blocks = self._agree(num_blocks_for(config.model, config.cache, config.dtype, config.device, kv_heads))
        self.kv_caches = allocate_kv_caches(
            config.model, self.num_blocks, config.cache.block_size, config.dtype, config.device, kv_heads
        )
        shapes = AttentionShapes(self.model.layers[0].self_attn.num_heads, kv_heads, config.model.head_dim,
                                 config.cache.block_size)  # fmt: skip
        self.attn_fn = select_backend(config.attention_backend, config.device, shapes, config.dtype)
        self.sampler = Sampler()
        self._sender = StepSender(self.tp) if self.tp.size > 1 and self.tp.is_driver else None
        self._receiver = StepReceiver(self.tp, config.device) if not self.tp.is_driver else None

    def prepare(self, scheduled: Sequence[ScheduledRequest]) -> ModelInput:
        return build_model_input(list(scheduled), self.config.cache.block_size, self.config.device)

    def _agree(self, num_blocks: int) -> int:
        """Every rank gets the fewest blocks any rank can hold: rank 0's block ids index all caches."""
        if self.tp.size == 1:
            return num_blocks
        count = torch.tensor([num_blocks], dtype=torch.int64)
        dist.all_reduce(count, op=dist.ReduceOp.MIN, group=self.tp.cpu_group)
        return int(count.item())

    @torch.inference_mode()
    def forward(self, batch: ModelInput, layer_done: LayerDone = None) -> torch.Tensor:
        """Hidden states of every token, [num_tokens, hidden_size]; writes this step's K/V.

        `layer_done(i)` is called as soon as layer i's K/V is in the cache (engine.kv_connector)."""
        return self.model(batch.input_ids, batch.positions, self.kv_caches, batch.meta, self.attn_fn, layer_done)

    @torch.inference_mode()
    def compute_logits(self, batch: ModelInput, attachment: bytes = b"", layer_done: LayerDone = None) -> torch.Tensor:
        """Float32 logits of the sampling rows: [num_sampling, vocab_size]."""
        return self._hidden_and_logits(batch, attachment, layer_done)[1]

    def _hidden_and_logits(self, batch: ModelInput, attachment: bytes, layer_done: LayerDone):
        """Hidden states of every row, and float32 logits of the sampling rows.

        Tensor parallel: the followers get `attachment` with this step (see `step_broadcast`).
        Sampling always works in float32 (as vLLM's does); for bfloat16 models the
        cast also makes the argmax several times faster on CPU.
        """
        if self._sender is not None:
            self._sender.send(batch, attachment)  # the other ranks run this same forward with us
        hidden = self.forward(batch, layer_done)
        return hidden, self.model.compute_logits(hidden[batch.logits_indices]).float()

    def receive_step(self) -> tuple[ModelInput, bytes] | None:
        """Ranks > 0: the batch rank 0 broadcast for the next step and its attachment; None when it shut down."""
        return self._receiver.recv()

    def shutdown(self) -> None:
        """Leave the tensor-parallel group (rank 0 stops the followers first). Idempotent."""
        if self._sender is not None:
            self._sender.shutdown()
            self._sender = None
        destroy_tp_group(self.tp)

    @torch.inference_mode()
    def execute(self, batch: ModelInput, attachment: bytes = b"", layer_done: LayerDone = None) -> SamplerOutput:
        hidden, logits = self._hidden_and_logits(batch, attachment, layer_done)
        out = self.sampler(logits, batch.sampling_states) if batch.sampling_states else SamplerOutput([], [])
        out.prompt_logprobs = [span_logprobs(self.model.compute_logits, hidden, span) for span in batch.prompt_spans]
        return out
