"""Convert a GGUF checkpoint once into a cached safetensors model directory.

transformers dequantises the GGUF (with the `gguf` library); the result is saved
as an ordinary Hugging Face directory under `<cache>/gguf/<stem>-<hash>`, so every
later start loads plain safetensors through the engine's own loader.

The cache is trusted only when it proves complete: the conversion writes a done-marker last (what it
converted: the source's path, size and mtime), and every use checks that marker and that each safetensors
file opens. A truncated shard or a missing marker is converted again, once, instead of crash-looping the
worker that loads it. The cache is private to the user (0700 folders, 0600 files): it holds the model.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import logging
import os
import shutil
import tempfile
import time
from pathlib import Path

from engine.model_errors import ModelConversionError

logger = logging.getLogger("tandem.model_source")

DONE_MARKER = ".tandem-converted.json"  # written last into a conversion: what it was converted from


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
    if _damage(target, gguf) is None:
        return target
    _make_private_dirs(target.parent)
    lock = FileLock(f"{target}.lock")
    try:
        lock.acquire(timeout=0)
    except Timeout:
        logger.info("Waiting for another process converting %s into %s", gguf, target)
        lock.acquire()
    try:
        damage = _damage(target, gguf)  # another process may have finished while we waited
        if damage is not None:
            if target.exists():
                logger.warning("The conversion %s is unusable (%s): converting %s again", target, damage, gguf)
            _convert_under_lock(gguf, target)
            _check_fresh_conversion(target, gguf)
    finally:
        lock.release()
    return target


def _has_weights(folder: Path) -> bool:
    """Whether `folder` looks like a model directory (config plus at least one safetensors file)."""
    return (folder / "config.json").is_file() and any(folder.glob("*.safetensors"))


def source_identity(gguf: Path) -> dict:
    """What a conversion records of its source, so a replaced or edited GGUF never passes for it."""
    stat = gguf.stat()
    return {"source": str(gguf), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}


def _damage(folder: Path, gguf: Path) -> str | None:
    """Why `folder` is not a complete conversion of `gguf` (None: it is): the done-marker missing or naming
    another source, no config or weights, or a safetensors file that does not open (truncated, corrupt)."""
    try:
        marker = json.loads((folder / DONE_MARKER).read_text())
    except (OSError, ValueError):
        return "no done-marker"
    if marker != source_identity(gguf):
        return "its done-marker names another source"
    if not _has_weights(folder):
        return "no config.json or no safetensors file"
    for shard in sorted(folder.glob("*.safetensors")):
        problem = _unreadable(shard)
        if problem is not None:
            return f"{shard.name} does not open: {problem}"
    return None


def _unreadable(shard: Path) -> str | None:
    """Why `shard` fails to open as safetensors (its header read and checked against the file's size)."""
    from safetensors import safe_open

    try:
        with safe_open(str(shard), framework="pt") as opened:
            opened.keys()
    except Exception as err:  # safetensors raises its own SafetensorError, or OSError
        return f"{type(err).__name__}: {err}"
    return None


def _check_fresh_conversion(target: Path, gguf: Path) -> None:
    # Converted once on this call: a conversion that fails its own check is an error to report, not a loop.
    damage = _damage(target, gguf)
    if damage is not None:
        raise ModelConversionError(f"the conversion of {gguf} into {target} is unusable right after it: {damage}")


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
        _make_private_files(tmp)
        _write_done_marker(tmp, gguf)
        os.rename(tmp, target)
    except BaseException:  # Ctrl-C included: never leave a half-written folder behind
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    logger.info("Converted %s in %.1f s", gguf.name, time.monotonic() - start)


def _make_private_dirs(folder: Path) -> None:
    """Create `folder` and the cache folders above it as 0700: other users on the host cannot read the model
    or plant a conversion for a worker to load."""
    missing = [p for p in (folder, *folder.parents) if not p.exists()]
    for path in reversed(missing):
        path.mkdir(mode=0o700, exist_ok=True)
        os.chmod(path, 0o700)  # mkdir's mode passes through the umask
    os.chmod(folder, 0o700)


def _make_private_files(folder: Path) -> None:
    os.chmod(folder, 0o700)
    for entry in folder.iterdir():
        if entry.is_file():
            os.chmod(entry, 0o600)


def _write_done_marker(folder: Path, gguf: Path) -> None:
    """Written last, after every weight is on disk (fsync'd), so its presence means the conversion ended."""
    for entry in folder.iterdir():
        if entry.is_file():
            _fsync(entry)
    marker = folder / DONE_MARKER
    marker.write_text(json.dumps(source_identity(gguf)))
    os.chmod(marker, 0o600)
    _fsync(marker)


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


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
    # Only the lock holder writes here, so any temp folder is from a killed process, and a target that
    # failed its check was damaged (a full disk, by hand) or made before done-markers: all safe to drop.
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
