"""Tandem's engine: what every worker shares (model, paged KV cache, scheduler, sampler).

`from engine import LLM, SamplingParams` works as in vLLM; names are imported
lazily so that `import engine.block_pool` stays light.
"""

import importlib

_EXPORTS = {
    "LLM": "engine.llm",
    "LLMEngine": "engine.llm_engine",
    "EngineArgs": "engine.llm_engine",
    "EngineStepError": "engine.llm_engine",
    "EngineConfig": "engine.config",
    "ModelConfig": "engine.config",
    "CacheConfig": "engine.config",
    "SchedulerConfig": "engine.config",
    "ParallelConfig": "engine.parallel.config",
    "TPFollower": "engine.parallel.follower",
    "SamplingParams": "engine.sampling_params",
    "RequestOutput": "engine.outputs",
    "CompletionOutput": "engine.outputs",
}

__all__ = list(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'engine' has no attribute {name!r}")
