"""Sizing and allocation of the paged KV cache: one (key, value) tensor pair per layer.

Layout per layer: [num_blocks, block_size, num_kv_heads, head_dim]; a token's
slot is block_id * block_size + offset, so a block is one contiguous run of
memory (what the KV transfer ships). Under tensor parallelism each rank's cache
holds only its own KV heads (`num_kv_heads` below is the per-rank count; by
default the model's), and every rank has the same number of blocks.
"""

import logging
import time

import numpy as np
import torch

from engine.config import DEFAULT_CPU_KV_CACHE_MEMORY, CacheConfig, ModelConfig
from engine.cpu_memory import fault_in, huge_pages

logger = logging.getLogger("tandem.engine")

KVCaches = list[tuple[torch.Tensor, torch.Tensor]]


def block_bytes(model: ModelConfig, block_size: int, dtype: torch.dtype, num_kv_heads: int | None = None) -> int:
    heads = model.num_kv_heads if num_kv_heads is None else num_kv_heads
    return model.kv_bytes_per_token(dtype) * block_size * heads // model.num_kv_heads


def num_blocks_for(
    model: ModelConfig, cache: CacheConfig, dtype: torch.dtype, device: str, num_kv_heads: int | None = None
) -> int:
    """Blocks that fit the budget: explicit count, explicit bytes, or the device default."""
    if cache.num_kv_blocks is not None:
        return cache.num_kv_blocks
    budget = cache.kv_cache_memory
    if budget is None:
        budget = _default_budget(cache, device)
    size = block_bytes(model, cache.block_size, dtype, num_kv_heads)
    n = budget // size
    if n < 1:
        raise ValueError(f"KV cache budget of {budget} bytes holds no block of {size} bytes; raise --kv-cache-memory")
    return int(n)


def _default_budget(cache: CacheConfig, device: str) -> int:
    if not device.startswith("cuda"):
        return DEFAULT_CPU_KV_CACHE_MEMORY
    free, total = torch.cuda.mem_get_info(torch.device(device))
    # The model is already loaded, so what is used now is weights plus runtime overhead.
    used = total - free
    return max(0, int(total * cache.gpu_memory_utilization) - used)


def allocate_kv_caches(
    model: ModelConfig,
    num_blocks: int,
    block_size: int,
    dtype: torch.dtype,
    device: str,
    num_kv_heads: int | None = None,
) -> KVCaches:
    heads = model.num_kv_heads if num_kv_heads is None else num_kv_heads
    shape = (num_blocks, block_size, heads, model.head_dim)
    started = time.perf_counter()
    caches = [(_zeros(shape, dtype, device), _zeros(shape, dtype, device)) for _ in range(model.num_layers)]
    total = 2 * model.num_layers * num_blocks * block_size * heads * model.head_dim
    logger.info(
        "KV cache: %d blocks of %d tokens = %d tokens max, %.1f MiB (%s, %s), allocated in %.1f s",
        num_blocks,
        block_size,
        num_blocks * block_size,
        total * torch.tensor([], dtype=dtype).element_size() / 2**20,
        dtype,
        device,
        time.perf_counter() - started,
    )
    return caches


def _zeros(shape: tuple[int, ...], dtype: torch.dtype, device: str) -> torch.Tensor:
    """Zeroed, not empty: masked-out slots still enter the attention matmul, and stale
    NaN bit patterns there would poison 0 * NaN.

    On CPU the zeros come from calloc (through numpy), in huge pages where the kernel
    has them, and are faulted in now: a step that writes KV into memory never touched
    before pays for it there (`engine.cpu_memory`).
    """
    if device.startswith("cuda"):
        return torch.zeros(shape, dtype=dtype, device=device)
    nbytes = torch.Size(shape).numel() * torch.tensor([], dtype=dtype).element_size()
    zeros = np.zeros(nbytes, dtype=np.uint8)
    huge_pages(zeros.ctypes.data, nbytes)
    fault_in(zeros)
    return torch.from_numpy(zeros).view(dtype).view(shape)
