"""Model definitions, picked by the `architectures` entry of config.json."""

from engine.models.decoder import DecoderForCausalLM

# All four families share one decoder; their differences are ModelConfig flags
# (qkv_bias for Qwen2, qk_norm and explicit head_dim for Qwen3).
MODEL_REGISTRY = {
    "LlamaForCausalLM": DecoderForCausalLM,
    "MistralForCausalLM": DecoderForCausalLM,
    "Qwen2ForCausalLM": DecoderForCausalLM,
    "Qwen3ForCausalLM": DecoderForCausalLM,
}

__all__ = ["MODEL_REGISTRY", "DecoderForCausalLM"]
