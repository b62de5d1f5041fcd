"""Tensor-parallel sizes a model cannot be split by, and bad rendezvous settings, fail at config time."""

import pytest

from engine import EngineArgs, LLMEngine
from engine.config import EngineConfig, ModelConfig
from engine.parallel.config import ParallelConfig, check_tensor_parallel


@pytest.mark.parametrize(
    "heads,kv_heads,inter,tp,match",
    [
        (4, 2, 128, 3, "attention heads"),
        (8, 8, 100, 8, "intermediate size"),
        (12, 3, 120, 2, "KV heads"),
        (16, 6, 128, 4, "KV heads"),
    ],
)
def test_indivisible_shapes_are_value_errors(heads, kv_heads, inter, tp, match):
    with pytest.raises(ValueError, match=match):
        check_tensor_parallel(heads, kv_heads, inter, tp)


@pytest.mark.parametrize("heads,kv_heads,inter,tp", [(4, 2, 128, 1), (4, 2, 128, 2), (4, 2, 128, 4), (8, 1, 96, 8)])
def test_divisible_shapes_pass(heads, kv_heads, inter, tp):
    check_tensor_parallel(heads, kv_heads, inter, tp)


def test_engine_args_reject_a_tp_size_the_model_cannot_take(tiny_model_dirs):
    with pytest.raises(ValueError, match="attention heads"):  # tiny models have 4 heads
        EngineArgs(model=tiny_model_dirs["llama"], tensor_parallel_size=3, dtype="float32").create_engine_config()


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(tp_size=0), "tensor_parallel_size"),
        (dict(tp_size=2, rank=2), "rank"),
        (dict(tp_size=2, rank=-1), "rank"),
        (dict(backend="mpi"), "backend"),
        (dict(init_addr="localhost"), "host:port"),
        (dict(init_addr="127.0.0.1:99999"), "host:port"),
    ],
)
def test_parallel_config_validation(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ParallelConfig(**kwargs)


def test_nccl_needs_cuda_and_rank_above_0_is_not_an_engine(tiny_model_dirs):
    model_dir = tiny_model_dirs["llama"]
    model = ModelConfig.from_pretrained(model_dir)
    with pytest.raises(ValueError, match="nccl"):
        EngineConfig(model_dir=model_dir, model=model, parallel=ParallelConfig(tp_size=2, backend="nccl"))
    config = EngineConfig(model_dir=model_dir, model=model, parallel=ParallelConfig(tp_size=2, rank=1))
    with pytest.raises(ValueError, match="TPFollower"):
        LLMEngine(config)
