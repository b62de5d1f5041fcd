"""Tiny random models of every supported architecture, saved as real HF directories.

Each directory holds config.json, safetensors weights (sharded with an index
for some) and a byte-level BPE tokenizer trained in-process, so the engine
loads it through its real loader. Building one takes well under a second.

    python -m tests.tiny_models OUT_DIR [--arch llama]
"""

from __future__ import annotations

import argparse
import functools
from pathlib import Path

import torch

VOCAB_SIZE = 384

_CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Paris is the capital of France. Berlin is the capital of Germany.",
    "def add(a, b):\n    return a + b\n",
    "Large language models predict the next token from the tokens before it.",
    "héllo wörld, 世界 🙂 numbers 0123456789 and punctuation !?;:",
] * 4

_COMMON = dict(
    vocab_size=VOCAB_SIZE,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    max_position_embeddings=512,
    rms_norm_eps=1e-6,
    # Larger than the usual 0.02 so logits are peaked and greedy argmax is not a near-tie.
    initializer_range=0.25,
    bos_token_id=1,
    eos_token_id=2,
)

ARCHS = {
    "llama": (
        "LlamaConfig",
        "LlamaForCausalLM",
        dict(
            num_key_value_heads=2,
            tie_word_embeddings=False,
            rope_theta=10000.0,
            rope_scaling=dict(
                rope_type="llama3",
                factor=8.0,
                low_freq_factor=1.0,
                high_freq_factor=4.0,
                original_max_position_embeddings=64,
            ),
        ),
    ),
    "mistral": ("MistralConfig", "MistralForCausalLM", dict(num_key_value_heads=1, tie_word_embeddings=False, sliding_window=None)),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", dict(num_key_value_heads=2, tie_word_embeddings=True, rope_theta=1e6)),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", dict(num_key_value_heads=1, head_dim=32, tie_word_embeddings=True)),
}


@functools.cache
def _tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=["<pad>", "<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_CORPUS, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<s>", eos_token="</s>")


def build_tiny_model(out_dir: str | Path, arch: str = "llama", seed: int = 0, max_shard_size: str | None = None) -> Path:
    """Write a tiny random `arch` model to out_dir and return the path."""
    import transformers

    config_cls, model_cls, extra = ARCHS[arch]
    config = getattr(transformers, config_cls)(**_COMMON, **extra)
    torch.manual_seed(seed)
    model = getattr(transformers, model_cls)(config).eval()
    out = Path(out_dir)
    kwargs = {"max_shard_size": max_shard_size} if max_shard_size else {}
    model.save_pretrained(out, safe_serialization=True, **kwargs)
    save_tokenizer(out)
    return out


def save_tokenizer(out_dir: str | Path) -> None:
    """The tiny byte-level BPE tokenizer (ids below VOCAB_SIZE), for a model built elsewhere."""
    _tokenizer().save_pretrained(out_dir)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir")
    parser.add_argument("--arch", choices=sorted(ARCHS), default="llama")
    args = parser.parse_args()
    print(build_tiny_model(args.out_dir, args.arch))


if __name__ == "__main__":
    main()
