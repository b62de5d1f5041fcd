"""Fake Hugging Face caches for the model-source tests: no network, no real cache."""

from __future__ import annotations

from pathlib import Path

import pytest

LOGGER = "tandem.model_source"


@pytest.fixture(autouse=True)
def isolated_hub(monkeypatch, tmp_path):
    """Keep every test off the network and away from the real HF cache."""
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf_home"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def fake_hf_snapshot(hf_home: Path, repo_id: str, files: dict[str, str]) -> Path:
    """Lay out <hf_home>/hub/models--org--name as huggingface_hub would after a download."""
    repo = hf_home / "hub" / ("models--" + repo_id.replace("/", "--"))
    snapshot = repo / "snapshots" / "0123abcd"
    snapshot.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0123abcd")
    for name, text in files.items():
        (snapshot / name).write_text(text)
    return snapshot


MODEL_FILES = {"config.json": "{}", "model.safetensors": "", "tokenizer.json": "{}"}
