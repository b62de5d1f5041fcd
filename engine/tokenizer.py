"""Tokenizer loading and the EOS ids generation stops on."""

from __future__ import annotations

import json
from pathlib import Path

from engine.config import ModelConfig


def load_tokenizer(model_dir: str | Path):
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(model_dir))
    except Exception as e:  # transformers raises many types for a missing/broken tokenizer
        raise ValueError(
            f"{model_dir}: could not load a tokenizer ({e}); pass token ids with skip_tokenizer_init=True"
        ) from e


def eos_token_ids_for(model_dir: str | Path, model: ModelConfig, tokenizer=None) -> tuple[int, ...]:
    """EOS ids as transformers' generate uses them: config.json plus generation_config.json."""
    ids = list(model.eos_token_ids)
    gen = Path(model_dir) / "generation_config.json"
    if gen.is_file():
        value = json.loads(gen.read_text()).get("eos_token_id")
        ids += [value] if isinstance(value, int) else list(value or [])
    if not ids and tokenizer is not None and tokenizer.eos_token_id is not None:
        ids.append(tokenizer.eos_token_id)
    return tuple(dict.fromkeys(ids))
