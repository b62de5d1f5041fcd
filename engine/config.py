"""Frozen configuration dataclasses shared by every engine component.

`ModelConfig` is read from a Hugging Face `config.json`; the cache and
scheduler configs come from user flags. None of them is mutated after
construction: derive a new one with `dataclasses.replace`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch

from engine.cpu_features import CPUFeatures, cpu_features
from engine.parallel.config import ParallelConfig, check_tensor_parallel

SUPPORTED_ARCHITECTURES = (
    "LlamaForCausalLM",
    "MistralForCausalLM",
    "Qwen2ForCausalLM",
    "Qwen3ForCausalLM",
)

_DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
    "half": torch.float16,
}


def auto_dtype(device: str = "cpu", features: CPUFeatures | None = None) -> torch.dtype:
    """bfloat16 on a GPU, and on a CPU that computes it in hardware (AVX512-BF16 or AMX: there it runs
    faster than float32, as vLLM's CPU build finds too); float32 on any other CPU, where bf16 is emulated."""
    if device != "cpu":
        return torch.bfloat16
    return torch.bfloat16 if (features or cpu_features()).native_bf16 else torch.float32


def parse_dtype(dtype: str | torch.dtype | None, device: str = "cpu") -> torch.dtype:
    """Map a user dtype name to a torch dtype; "auto"/None is `auto_dtype(device)`."""
    if isinstance(dtype, torch.dtype):
        if dtype not in _DTYPES.values():
            raise ValueError(f"unsupported dtype {dtype}; use float32, bfloat16 or float16")
        return dtype
    if dtype is None or dtype == "auto":
        return auto_dtype(device)
    if dtype not in _DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; use one of auto, float32, bfloat16, float16")
    return _DTYPES[dtype]


QUANTIZATIONS = ("auto", "gguf", "int8", "none")


@dataclass(frozen=True)
class RopeScaling:
    """Llama-3 style frequency-dependent rope scaling (rope_type "llama3")."""

    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_position_embeddings: int


@dataclass(frozen=True)
class ModelConfig:
    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    qkv_bias: bool
    qk_norm: bool
    rope_scaling: RopeScaling | None = None
    eos_token_ids: tuple[int, ...] = ()
    bos_token_id: int | None = None

    @classmethod
    def from_pretrained(cls, model_dir: str | Path) -> "ModelConfig":
        path = Path(model_dir) / "config.json"
        if not path.is_file():
            raise FileNotFoundError(f"{path}: missing config.json in model directory {model_dir}")
        return cls.from_hf_dict(json.loads(path.read_text()), source=str(path))

    @classmethod
    def from_hf_dict(cls, cfg: dict, source: str = "config.json") -> "ModelConfig":
        arch = _architecture(cfg, source)
        num_heads = cfg["num_attention_heads"]
        hidden = cfg["hidden_size"]
        return cls(
            architecture=arch,
            vocab_size=cfg["vocab_size"],
            hidden_size=hidden,
            intermediate_size=cfg["intermediate_size"],
            num_layers=cfg["num_hidden_layers"],
            num_heads=num_heads,
            num_kv_heads=cfg.get("num_key_value_heads") or num_heads,
            head_dim=cfg.get("head_dim") or hidden // num_heads,
            rms_norm_eps=cfg.get("rms_norm_eps", 1e-6),
            rope_theta=_rope_theta(cfg),
            max_position_embeddings=cfg.get("max_position_embeddings", 2048),
            tie_word_embeddings=cfg.get("tie_word_embeddings", False),
            qkv_bias=arch == "Qwen2ForCausalLM" or bool(cfg.get("attention_bias", False)),
            qk_norm=arch == "Qwen3ForCausalLM",
            rope_scaling=_rope_scaling(cfg, source),
            eos_token_ids=_as_ids(cfg.get("eos_token_id")),
            bos_token_id=cfg.get("bos_token_id"),
        )

    def kv_bytes_per_token(self, dtype: torch.dtype) -> int:
        """Bytes of K plus V for one token across all layers."""
        elem = torch.tensor([], dtype=dtype).element_size()
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * elem


def _architecture(cfg: dict, source: str) -> str:
    archs = cfg.get("architectures") or []
    for arch in archs:
        if arch in SUPPORTED_ARCHITECTURES:
            return arch
    raise ValueError(
        f"{source}: unsupported architecture {archs or '(none given)'}; "
        f"supported: {', '.join(SUPPORTED_ARCHITECTURES)}"
    )


def _rope_theta(cfg: dict) -> float:
    # transformers >= 5 moves rope_theta into rope_parameters.
    params = cfg.get("rope_parameters") or {}
    return float(cfg.get("rope_theta") or params.get("rope_theta") or 10000.0)


def _rope_scaling(cfg: dict, source: str) -> RopeScaling | None:
    scaling = cfg.get("rope_scaling") or cfg.get("rope_parameters")
    if not scaling:
        return None
    rope_type = scaling.get("rope_type", scaling.get("type", "default"))
    if rope_type == "default":
        return None
    if rope_type != "llama3":
        raise ValueError(f"{source}: unsupported rope scaling type {rope_type!r}; supported: llama3")
    return RopeScaling(
        factor=float(scaling["factor"]),
        low_freq_factor=float(scaling["low_freq_factor"]),
        high_freq_factor=float(scaling["high_freq_factor"]),
        original_max_position_embeddings=int(scaling["original_max_position_embeddings"]),
    )


def _as_ids(value) -> tuple[int, ...]:
    if value is None:
        return ()
    if isinstance(value, int):
        return (value,)
    return tuple(int(v) for v in value)


@dataclass(frozen=True)
class CacheConfig:
    """Paged KV cache sizing. Exactly one of `num_kv_blocks` / `kv_cache_memory` may be set;
    with neither, CPU uses `DEFAULT_CPU_KV_CACHE_MEMORY` and CUDA `gpu_memory_utilization`."""

    block_size: int = 16
    num_kv_blocks: int | None = None
    kv_cache_memory: int | None = None
    gpu_memory_utilization: float = 0.9
    enable_prefix_caching: bool = True

    def __post_init__(self):
        if self.block_size <= 0 or self.block_size & (self.block_size - 1):
            raise ValueError(f"block_size must be a positive power of two, got {self.block_size}")
        if self.num_kv_blocks is not None and self.kv_cache_memory is not None:
            raise ValueError("set num_kv_blocks or kv_cache_memory, not both")
        if self.num_kv_blocks is not None and self.num_kv_blocks < 1:
            raise ValueError(f"num_kv_blocks must be >= 1, got {self.num_kv_blocks}")
        if self.kv_cache_memory is not None and self.kv_cache_memory <= 0:
            raise ValueError(f"kv_cache_memory must be > 0 bytes, got {self.kv_cache_memory}")
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ValueError("gpu_memory_utilization must be in (0, 1]")


DEFAULT_CPU_KV_CACHE_MEMORY = 2 * 1024**3


@dataclass(frozen=True)
class SchedulerConfig:
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 2048
    max_model_len: int = 2048

    def __post_init__(self):
        if self.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be >= 1, got {self.max_num_seqs}")
        if self.max_num_batched_tokens < 1:
            raise ValueError(f"max_num_batched_tokens must be >= 1, got {self.max_num_batched_tokens}")
        if self.max_model_len < 2:
            raise ValueError(f"max_model_len must be >= 2, got {self.max_model_len}")


@dataclass(frozen=True)
class EngineConfig:
    model_dir: str
    model: ModelConfig
    cache: CacheConfig = field(default_factory=CacheConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    dtype: torch.dtype = torch.float32
    device: str = "cpu"
    attention_backend: str = "auto"
    seed: int = 0
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    # "auto": a model converted from a GGUF file keeps the file's quantized blocks where the CPU kernels
    # multiply them (engine.gguf_weights), each band of rows by the kernel timed fastest, integer dot products
    # over activations quantized to int8 per block among them (llama.cpp's arithmetic); "gguf": the blocks,
    # multiplied in `dtype` only (the widened weights' values, summed in another order); "int8": as auto, and
    # every other linear quantized to Q8_0 blocks at load (engine.int8_weights: a float checkpoint's too);
    # "none": every weight widened to `dtype`
    quantization: str = "auto"

    def __post_init__(self):
        from engine.attention import BACKENDS, resolve_backend
        from engine.attention.triton_backend import check_triton_config

        m = self.model
        check_tensor_parallel(m.num_heads, m.num_kv_heads, m.intermediate_size, self.parallel.tp_size)
        self.parallel.resolve_backend(self.device)

        if self.quantization not in QUANTIZATIONS:
            raise ValueError(f"quantization must be one of {', '.join(QUANTIZATIONS)}, got {self.quantization!r}")
        if self.attention_backend not in BACKENDS:
            raise ValueError(f"attention_backend must be one of {', '.join(BACKENDS)}, got {self.attention_backend!r}")
        if resolve_backend(self.attention_backend, self.device) == "triton":
            check_triton_config(self.model.head_dim, self.cache.block_size, self.dtype, self.device)
