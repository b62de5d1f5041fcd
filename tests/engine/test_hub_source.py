"""engine.hub_source through engine.model_source: Hugging Face repo ids, offline and online (a faked hub)."""

from __future__ import annotations

import logging
import threading
import time
from types import SimpleNamespace

import pytest

from engine.hub_source import HUB_ALLOW_PATTERNS
from engine.model_source import (
    ModelNotFoundError,
    resolve_model,
)

from tests.engine.model_files import LOGGER, MODEL_FILES, fake_hf_snapshot, isolated_hub  # noqa: F401 (autouse)


def test_unknown_hub_id_offline_fails_fast_and_clearly():
    start = time.monotonic()
    with pytest.raises(FileNotFoundError) as info:
        resolve_model("foo/bar")
    assert time.monotonic() - start < 3.0
    message = str(info.value)
    assert "'foo/bar' is not a local directory" in message
    assert "HF_HUB_OFFLINE=1" in message
    assert "huggingface-cli download foo/bar" in message
    assert "local directory" in message


def test_cached_hub_repo_is_used_offline(tmp_path):
    snapshot = fake_hf_snapshot(tmp_path / "hf_home", "org/name", MODEL_FILES)
    assert resolve_model("org/name") == snapshot.resolve()


def test_cached_repo_without_safetensors_is_rejected(tmp_path):
    fake_hf_snapshot(tmp_path / "hf_home", "org/binonly", {"config.json": "{}"})
    with pytest.raises(ModelNotFoundError, match="safetensors"):
        resolve_model("org/binonly")


@pytest.fixture
def online(monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)


def test_unreachable_hub_fails_fast_even_if_it_hangs(online, monkeypatch):
    from huggingface_hub import HfApi

    release = threading.Event()
    monkeypatch.setattr(HfApi, "model_info", lambda self, *a, **k: release.wait(30))
    monkeypatch.setenv("HF_HUB_ETAG_TIMEOUT", "0.5")
    start = time.monotonic()
    try:
        with pytest.raises(ModelNotFoundError) as info:
            resolve_model("foo/bar")
    finally:
        release.set()
    assert time.monotonic() - start < 5.0
    message = str(info.value)
    assert "could not be reached" in message
    assert "HF_HUB_OFFLINE=1" in message
    assert "local directory" in message


def test_unreachable_hub_falls_back_to_the_cache(online, monkeypatch, tmp_path, caplog):
    from huggingface_hub import HfApi

    def refuse(self, *args, **kwargs):
        raise ConnectionError("connection refused")

    monkeypatch.setattr(HfApi, "model_info", refuse)
    snapshot = fake_hf_snapshot(tmp_path / "hf_home", "org/name", MODEL_FILES)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert resolve_model("org/name") == snapshot.resolve()
    assert any("cached copy" in r.getMessage() for r in caplog.records)


def test_repo_missing_on_hub(online, monkeypatch):
    from huggingface_hub import HfApi
    from huggingface_hub.errors import RepositoryNotFoundError

    def missing(self, *args, **kwargs):
        raise RepositoryNotFoundError("404", response=SimpleNamespace(headers={}, request=None))

    monkeypatch.setattr(HfApi, "model_info", missing)
    with pytest.raises(ModelNotFoundError, match="not found on the Hugging Face hub"):
        resolve_model("foo/bar")


def test_online_download_asks_only_for_the_needed_files(online, monkeypatch, tmp_path):
    import huggingface_hub
    from huggingface_hub import HfApi

    snapshot = tmp_path / "downloaded"
    snapshot.mkdir()
    for name, text in MODEL_FILES.items():
        (snapshot / name).write_text(text)
    calls = []

    def fake_snapshot_download(repo_id, **kwargs):
        calls.append(kwargs)
        if kwargs["local_files_only"]:
            raise FileNotFoundError("not cached")
        return str(snapshot)

    monkeypatch.setattr(HfApi, "model_info", lambda self, *a, **k: None)
    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake_snapshot_download)
    assert resolve_model("org/name") == snapshot.resolve()
    assert [c["local_files_only"] for c in calls] == [True, False]
    patterns = calls[-1]["allow_patterns"]
    assert patterns == list(HUB_ALLOW_PATTERNS)
    for needed in ("config.json", "*.safetensors", "model.safetensors.index.json", "tokenizer.json"):
        assert needed in patterns
    assert calls[-1]["cache_dir"] == str(tmp_path / "hf_home" / "hub")
