"""Convert a GGUF checkpoint once into a cached safetensors model directory.

transformers dequantises the GGUF (with the `gguf` library); the result is saved
as an ordinary Hugging Face directory under `<cache>/gguf/<stem>-<hash>`, so every
later start loads plain safetensors through the engine's own loader.
"""

from __future__ import annotations

import hashlib
import inspect
import logging
import os
import shutil
import tempfile
import time
from pathlib import Path

from engine.model_errors import ModelConversionError

logger = logging.getLogger("tandem.model_source")


def tandem_cache_dir(cache_dir: str | os.PathLike | None = None) -> Path:
    """The Tandem cache root: `cache_dir`, else env TANDEM_CACHE_DIR, else ~/.cache/tandem."""
    root = cache_dir or os.environ.get("TANDEM_CACHE_DIR") or "~/.cache/tandem"
    return Path(root).expanduser().resolve()


def gguf_cache_dir(gguf: str | os.PathLike, cache_dir: str | os.PathLike | None = None) -> Path:
    """Where the conversion of `gguf` lives: <cache>/gguf/<stem>-<hash of path, size, mtime>.

    Symlinks are followed, so every link to one file shares one conversion; editing
    or replacing the file changes its size or mtime and so gives a fresh folder.
    """
    real = Path(gguf).expanduser().resolve()
    stat = real.stat()
    key = f"{real}\0{stat.st_size}\0{stat.st_mtime_ns}".encode()
    digest = hashlib.sha256(key).hexdigest()[:12]
    return tandem_cache_dir(cache_dir) / "gguf" / f"{real.stem}-{digest}"


def convert_gguf(gguf: str | os.PathLike, cache_dir: str | os.PathLike | None = None) -> Path:
    """Convert `gguf` once into a cached safetensors directory and return that directory.

    Safe with several processes at once: a file lock beside the target serialises the
    conversion, which is written into a temp folder and renamed into place, so a
    half-written directory is never visible under the final name.
    """
    from filelock import FileLock, Timeout

    gguf = Path(gguf).expanduser().resolve()
    target = gguf_cache_dir(gguf, cache_dir)
    if _has_weights(target):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    lock = FileLock(f"{target}.lock")
    try:
        lock.acquire(timeout=0)
    except Timeout:
        logger.info("Waiting for another process converting %s into %s", gguf, target)
        lock.acquire()
    try:
        if not _has_weights(target):  # another process may have finished while we waited
            _convert_under_lock(gguf, target)
    finally:
        lock.release()
    return target


def _has_weights(folder: Path) -> bool:
    """Whether `folder` is a usable model directory (config plus at least one safetensors file)."""
    return (folder / "config.json").is_file() and any(folder.glob("*.safetensors"))


def _convert_under_lock(gguf: Path, target: Path) -> None:
    """Convert into a temp folder beside `target`, then rename it into place. Caller holds the lock."""
    _remove_leftovers(target)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    logger.info(
        "Converting GGUF %s into a safetensors model at %s (done once; ~20 s for a small model)", gguf, target
    )
    start = time.monotonic()
    try:
        _convert_reporting_errors(gguf, tmp)
        _make_readable(tmp)
        os.rename(tmp, target)
    except BaseException:  # Ctrl-C included: never leave a half-written folder behind
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    logger.info("Converted %s in %.1f s", gguf.name, time.monotonic() - start)


def _make_readable(folder: Path) -> None:
    # mkdtemp and safetensors create private (0700/0600) entries; the cache is meant to be shared.
    os.chmod(folder, 0o755)
    for entry in folder.iterdir():
        if entry.is_file():
            os.chmod(entry, 0o644)


def _convert_reporting_errors(gguf: Path, out: Path) -> None:
    try:
        _convert_into(gguf, out)
    except ModelConversionError:
        raise
    except Exception as err:  # transformers supports only some GGUF architectures and quant types
        raise ModelConversionError(
            f"could not convert {gguf} into a safetensors model: {type(err).__name__}: {err}"
        ) from err


def _remove_leftovers(target: Path) -> None:
    # Only the lock holder writes here, so any temp folder is from a killed process,
    # and a target without weights was damaged by hand: both are safe to drop.
    for stale in target.parent.glob(f".{target.name}.tmp-*"):
        shutil.rmtree(stale, ignore_errors=True)
    if target.exists():
        logger.warning("Removing incomplete conversion %s", target)
        shutil.rmtree(target)


def _convert_into(gguf: Path, out: Path) -> None:
    """Dequantise `gguf` with transformers and save config, weights, tokenizer and generation config."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, name = str(gguf.parent), gguf.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(
        folder, gguf_file=name, dtype=torch.float32, local_files_only=True, **_dequantize_kwargs()
    )
    _drop_gguf_quantizer(model, gguf)
    if not model.config.architectures:  # GGUF metadata does not carry it
        model.config.architectures = [type(model).__name__]
    model.save_pretrained(out, safe_serialization=True)
    model.generation_config.save_pretrained(out)
    tokenizer.save_pretrained(out)


def _dequantize_kwargs() -> dict:
    """Ask transformers for plain dense weights where it could otherwise keep GGUF blocks packed."""
    try:
        from transformers.utils.quantization_config import GgufConfig
    except ImportError:  # older transformers always dequantise GGUF files
        return {}
    if "dequantize" not in inspect.signature(GgufConfig).parameters:
        return {}
    return {"quantization_config": GgufConfig(dequantize=True)}


def _drop_gguf_quantizer(model, gguf: Path) -> None:
    # A GGUF quantizer left on the model makes save_pretrained refuse to save; once every
    # weight is a dense float tensor the model is an ordinary one and it can go.
    quantizer = getattr(model, "hf_quantizer", None)
    if quantizer is None:
        return
    packed = [name for name, p in model.named_parameters() if not p.dtype.is_floating_point]
    if packed:
        raise ModelConversionError(
            f"transformers kept {len(packed)} weights of {gguf.name} packed (e.g. {packed[0]}); "
            "cannot save them as dense safetensors"
        )
    quantizer.remove_quantization_config(model)
