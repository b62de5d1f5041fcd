"""Profiles of devices never seen here, from their published figures and stated efficiency factors.

    tandem plan --device h100 --device l40s ...    plans pools of GPUs no session has had at hand

Each term of the step cost (`step_cost.StepCost`) is a count of bytes or FLOPs over a peak rate times the
share of it a kernel reaches:

    weights_s                   = the longer of: weight bytes / tp / (memory bandwidth * MEMORY_EFFICIENCY)
                                  and the host's launches: layers * HOST_LAUNCHES_PER_LAYER * HOST_PER_LAUNCH_S
    per_token_s                 = 2 * linear params / tp / (dense bf16 FLOP/s * MATMUL_EFFICIENCY)
    per_sampled_row_s           = 2 * vocab * hidden / tp / (FLOP/s * MATMUL_EFFICIENCY)
    per_decode_context_token_s  = KV bytes per token / tp / (memory bandwidth * MEMORY_EFFICIENCY)
    per_attention_pair_s        = 4 * layers * heads * head_dim / tp / (FLOP/s * ATTENTION_EFFICIENCY)
    per_prefill_context_token_s = KV bytes per token / tp / (memory bandwidth * MEMORY_EFFICIENCY)
    fixed_s                     = HOST_STEP_S    (scheduling, inputs, the sampled tokens' copy back)
                                  + tensor parallel: 2 all-reduces per layer, ALLREDUCE_LATENCY_S each
    per_token_comm_s            = 2 * layers * 2 (tp - 1) / tp * hidden * bytes / (NVLink * LINK_EFFICIENCY)
    per_sequence_s              = HOST_PER_SEQUENCE_S
    per_prefix_attention_pair_s, per_small_step_token_s = 0   (a measured profile's: no published figure
                                  says what a masked chunk or a small matrix product loses on a GPU)
    KV capacity                 = (memory * GPU_MEMORY_UTILIZATION - weights / tp - ACTIVATION_RESERVE) per
                                  GPU, times tp, over the KV bytes of a token; a model that does not fit is an error
    KV transfer between pools   = TRANSFER_LATENCY_S + bytes / (inter-node link * LINK_EFFICIENCY)

Why these factors: decode kernels read HBM at 70-80% of peak in vLLM's and SGLang's published traces;
large GEMMs reach 60-70% of dense peak; Tandem's Triton prefill attention is a plain tiled kernel, not
FlashAttention-3, so it gets less (0.35).

The host terms were measured on a lent H200 (2026-11-26, scripts/gpu_check.py's profile and step_trace
steps, SmolLM2-135M's shape in bf16; benchmarks/profiles/): Tandem's engine runs eagerly, without CUDA
graphs, and a decode step launched 929 kernels and copies for 30 layers (31 a layer), the device busy
1.7 of its 13-17 ms. The device runs a step's kernels while the host launches the next ones, so the
host's launches are a floor under the linear layers' term (the longer of the two), not a term added to
it; the attention and sampling terms still add on top, a small overestimate where the host binds. At
17 us a launch (the fastest steps measured: 16.2 ms for 959), the host bounds every model at small
batches on these GPUs: an 8B model's 32 layers cost 16.9 ms of launches against 6.4 ms of weights on an
H100. That published profile predicted the H200's measured steps with
a median error of 11% (p90 43%: steps there took 16-17 ms or 30-32 ms, bimodal, for the same shape);
with the earlier guess (1 ms + 60 us a layer, added) it was 83%. The efficiency factors of the device's
own work are guesses still: at this model's size on an H200 no step left the host's floor.
"""

from __future__ import annotations

from dataclasses import dataclass

from costmodel.model_dims import ModelDims
from costmodel.profile import Profile
from costmodel.step_cost import StepCost
from costmodel.transfer_cost import TransferCost

MATMUL_EFFICIENCY = 0.6
ATTENTION_EFFICIENCY = 0.35
MEMORY_EFFICIENCY = 0.75
LINK_EFFICIENCY = 0.7
HOST_STEP_S = 0.001
HOST_LAUNCHES_PER_LAYER = 31  # kernels and copies a layer launches (measured: 929 for 30 layers)
HOST_PER_LAUNCH_S = 17e-6  # host time per launch: Python, PyTorch's dispatch, the driver (measured)
HOST_PER_SEQUENCE_S = 0.00002
ALLREDUCE_LATENCY_S = 0.00001
GPU_MEMORY_UTILIZATION = 0.9  # the engine's default share of device memory
ACTIVATION_RESERVE_BYTES = 2 << 30  # a 2,048-token step's activations and logits, with room
TRANSFER_LATENCY_S = 0.0005  # handshake and first chunk of a KV transfer between nodes


@dataclass(frozen=True)
class DeviceFigures:
    """A GPU's datasheet: dense (no sparsity) 16-bit matmul FLOP/s, memory, links."""

    name: str
    bf16_flops: float
    memory_bytes_per_s: float
    memory_bytes: float
    nvlink_bytes_per_s: float  # one direction, between GPUs of one node (PCIe where there is no NVLink)
    network_bytes_per_s: float  # one direction, per GPU, between nodes (the KV path between pools)


DEVICES: dict[str, DeviceFigures] = {
    "h100": DeviceFigures("H100-SXM", 989e12, 3.35e12, 80e9, 450e9, 50e9),  # NDR InfiniBand 400 Gb/s per GPU
    "h200": DeviceFigures("H200-SXM", 989e12, 4.8e12, 141e9, 450e9, 50e9),
    "a100": DeviceFigures("A100-SXM-80GB", 312e12, 2.039e12, 80e9, 300e9, 25e9),  # HDR 200 Gb/s
    "l40s": DeviceFigures("L40S", 362e12, 0.864e12, 48e9, 32e9, 25e9),  # PCIe Gen4 x16, 200 GbE
}


def device_figures(name: str) -> DeviceFigures:
    try:
        return DEVICES[name.lower()]
    except KeyError:
        raise ValueError(f"unknown device {name!r}: published figures are known for "
                         f"{', '.join(sorted(DEVICES))}") from None  # fmt: skip


def published_profile(device: str | DeviceFigures, model: ModelDims, tp_size: int = 1, dtype_bytes: int = 2,
                      device_price_per_hour: float | None = None) -> Profile:  # fmt: skip
    """The profile of a worker of `tp_size` such devices, from their figures (its price: `tp_size` device-hours);
    raises ValueError when the model does not fit in their memory or cannot be split `tp_size` ways."""
    dev = device if isinstance(device, DeviceFigures) else device_figures(device)
    if tp_size < 1 or model.num_kv_heads % tp_size and tp_size % model.num_kv_heads:
        raise ValueError(f"{model.name}: {model.num_kv_heads} KV heads cannot be split over tp {tp_size}")
    flops, mem = dev.bf16_flops * MATMUL_EFFICIENCY, dev.memory_bytes_per_s * MEMORY_EFFICIENCY
    comm = 0.0 if tp_size == 1 else 2 * (tp_size - 1) / tp_size * model.hidden_size * dtype_bytes
    launches_s = model.num_layers * HOST_LAUNCHES_PER_LAYER * HOST_PER_LAUNCH_S  # no fewer under tensor parallel
    step = StepCost(
        fixed_s=HOST_STEP_S + (2 * model.num_layers * ALLREDUCE_LATENCY_S if tp_size > 1 else 0.0),
        weights_s=max(model.weight_params * dtype_bytes / tp_size / mem, launches_s),
        per_token_s=2 * model.linear_params / tp_size / flops,
        per_token_comm_s=2 * model.num_layers * comm / (dev.nvlink_bytes_per_s * LINK_EFFICIENCY),
        per_sampled_row_s=2 * model.lm_head_params / tp_size / flops,
        per_sequence_s=HOST_PER_SEQUENCE_S,
        per_decode_context_token_s=model.kv_bytes_per_token(dtype_bytes) / tp_size / mem,
        per_attention_pair_s=model.attention_flops_per_pair() / tp_size
        / (dev.bf16_flops * ATTENTION_EFFICIENCY),
        per_prefill_context_token_s=model.kv_bytes_per_token(dtype_bytes) / tp_size / mem,
    )  # fmt: skip
    return Profile(
        device=dev.name, source="published", model=model, dtype="bfloat16" if dtype_bytes == 2 else f"{dtype_bytes}B",
        dtype_bytes=dtype_bytes, tp_size=tp_size, step=step,
        transfer=TransferCost(TRANSFER_LATENCY_S, dev.network_bytes_per_s * LINK_EFFICIENCY),
        kv_cache_tokens=kv_capacity_tokens(dev, model, tp_size, dtype_bytes),
        notes=(f"published figures: {dev.bf16_flops / 1e12:g} TFLOP/s bf16 dense, "
               f"{dev.memory_bytes_per_s / 1e12:g} TB/s memory, {dev.memory_bytes / 1e9:g} GB",
               f"efficiency: matmul {MATMUL_EFFICIENCY}, attention {ATTENTION_EFFICIENCY}, memory "
               f"{MEMORY_EFFICIENCY}, links {LINK_EFFICIENCY}; host {HOST_STEP_S * 1e3:g} ms a step, "
               f"{HOST_LAUNCHES_PER_LAYER} launches a layer at {HOST_PER_LAUNCH_S * 1e6:g} us (measured on an H200)"),
        price_per_hour=None if device_price_per_hour is None else device_price_per_hour * tp_size,
    )  # fmt: skip


def kv_capacity_tokens(dev: DeviceFigures, model: ModelDims, tp_size: int, dtype_bytes: int) -> int:
    """Tokens of KV a worker of `tp_size` devices holds once its weights are in; ValueError if they do not fit."""
    weights = model.weight_params * dtype_bytes / tp_size
    free = dev.memory_bytes * GPU_MEMORY_UTILIZATION - weights - ACTIVATION_RESERVE_BYTES
    if free <= 0:
        raise ValueError(f"{model.name} does not fit on {dev.name} at tp {tp_size}: {weights / 1e9:.1f} GB of weights "
                         f"per GPU, {dev.memory_bytes * GPU_MEMORY_UTILIZATION / 1e9:.1f} GB usable")  # fmt: skip
    return int(free * tp_size // model.kv_bytes_per_token(dtype_bytes))
