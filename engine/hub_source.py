"""Resolve a Hugging Face hub repo id to a local snapshot, fast and with clear errors offline."""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass
from pathlib import Path

from engine.gguf_convert import _has_weights
from engine.model_errors import ModelNotFoundError

logger = logging.getLogger("tandem.model_source")

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
