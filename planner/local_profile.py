"""The profile of a worker on the machine at hand: measured once (`tandem profile`), cached, reused.

    profile = local_profile(LocalWorker(model=None, dtype="auto", torch_threads=2))

Measuring builds the engine a worker would run (model, dtype, threads, engine knobs), warms it up,
times it over the profiler's grid (`planner.profiler`), fits the step cost (`planner.fit`) and times a
KV transfer between two processes (`planner.transfer_probe`): a minute or two on 2 cores. The result
is cached under `~/.cache/tandem/profiles/` (or $TANDEM_CACHE_DIR) by a key of everything it depends
on: the CPU and its enabled extensions, threads, dtype, torch, the native kernels' sources, the
engine's own sources, the model and the engine knobs that shape a step. Change any and it is
measured again.
"""

from __future__ import annotations

import dataclasses
import gc
import hashlib
import json
import logging
import os
import platform
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from costmodel import ModelDims, Profile, ServingCost, TransferCost
from planner.layout import EngineLimits
from planner.profiler import ProfileGrid

logger = logging.getLogger("tandem.planner")
METHOD = "grid-v7"  # how steps are timed and fitted: part of the key


@dataclass(frozen=True)
class LocalWorker:
    """A worker on this machine, as a pool of `tandem serve` would start it."""

    model: str | None = None  # a model dir, a .gguf, a hub id, None: the default model
    dtype: str = "auto"
    torch_threads: int = 1
    limits: EngineLimits = field(default_factory=EngineLimits)
    device: str = "cpu"

    def engine_args(self):
        from engine.llm_engine import EngineArgs

        lim = self.limits
        return EngineArgs(model=self.model, dtype=self.dtype, device=self.device, block_size=lim.block_size,
                          max_num_seqs=lim.max_num_seqs, max_num_batched_tokens=lim.max_num_batched_tokens,
                          max_model_len=lim.max_model_len, enable_prefix_caching=lim.enable_prefix_caching,
                          kv_cache_memory=lim.kv_cache_memory, num_kv_blocks=lim.num_kv_blocks,
                          quantization=lim.quantization)  # fmt: skip


def engine_spec(limits: EngineLimits) -> dict:
    """The knobs of `limits` as a cluster spec's `engine` section (`cluster.spec.EngineSpec`: the same names):
    a deployment of the worker a profile measured (its serving calibration) runs the same engine."""
    return {k: v for k, v in dataclasses.asdict(limits).items() if v is not None}


def model_dims(model_dir: str | Path, name: str = "") -> ModelDims:
    config = json.loads((Path(model_dir) / "config.json").read_text())
    return ModelDims.from_hf_config(config, name or Path(model_dir).name)


def profile_key(worker: LocalWorker, model_dir: str) -> tuple[str, ...]:
    import torch

    from engine.native.loader import kernel_source_id

    config = (Path(model_dir) / "config.json").read_bytes()
    lim = worker.limits
    return (
        f"device {worker.device}: {device_name(worker.device)}",
        f"threads {worker.torch_threads}", f"dtype {worker.dtype}", f"torch {torch.__version__}",
        f"kernels {kernel_source_id()}", f"engine {_engine_source_hash()}",
        f"model {model_dir} {hashlib.blake2b(config, digest_size=8).hexdigest()}",
        f"engine knobs {lim.block_size} {lim.max_num_batched_tokens} {lim.max_num_seqs} {lim.max_model_len} "
        f"{lim.kv_cache_memory} {lim.num_kv_blocks} {lim.enable_prefix_caching} {lim.quantization}",
        f"method {METHOD}", f"python {platform.python_version()}",
    )  # fmt: skip


def local_profile(worker: LocalWorker, refresh: bool = False, grid: ProfileGrid = ProfileGrid(),
                  on_progress: Callable[[str], None] = lambda what: None) -> Profile:  # fmt: skip
    """The cached profile of `worker` on this machine, measured first when there is none (or `refresh`)."""
    from engine.model_source import resolve_model

    model_dir = str(resolve_model(worker.model))
    key = profile_key(worker, model_dir)
    path = cache_path(key)
    if not refresh and path.is_file():
        try:
            cached = Profile.load(path)
            if cached.key == key:
                return cached
        except ValueError as err:
            logger.warning("measuring again: %s", err)
    profile, samples = measure_profile(worker, model_dir, key, grid, on_progress)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        profile.save(path)
        save_samples(samples, samples_path(key))
    except OSError as err:
        logger.warning("cannot cache the profile at %s: %s", path, err)
    return profile


def cache_path(key: tuple[str, ...]) -> Path:
    return _cache_dir() / f"{hashlib.blake2b(chr(10).join(key).encode(), digest_size=10).hexdigest()}.json"


def samples_path(key: tuple[str, ...]) -> Path:
    """Where the measured steps of the profile cached under `key` are kept (`save_samples`)."""
    return cache_path(key).with_suffix(".samples.json")


def store(profile: Profile) -> Path:
    """Cache `profile` (a measured one, its serving costs calibrated since) under its own key."""
    path = cache_path(profile.key)
    path.parent.mkdir(parents=True, exist_ok=True)
    profile.save(path)
    return path


def measure_profile(worker: LocalWorker, model_dir: str, key: tuple[str, ...] = (), grid: ProfileGrid = ProfileGrid(),
                    on_progress: Callable[[str], None] = lambda what: None,
                    transfer: TransferCost | None = None) -> tuple[Profile, list]:  # fmt: skip
    """The measured profile, and the steps it was fitted to (`planner.fit.StepSample`s). The KV transfer is
    timed between two processes unless `transfer` is given (where pyzmq is absent: the lent GPU's image)."""
    import torch

    from engine.llm_engine import LLMEngine
    from planner.fit import fit_step_cost
    from planner.profiler import KERNEL_BAND_FIRSTS, profile_steps

    torch.set_num_threads(worker.torch_threads)
    on_progress(f"starting the engine ({worker.torch_threads} thread(s))")
    engine = LLMEngine.from_args(worker.engine_args(), skip_tokenizer_init=True, show_progress=False)
    try:
        engine.warm_up()
        samples = profile_steps(engine, grid, on_progress=on_progress, warm_pass=worker.device != "cpu")
        config = engine.config
        kv_tokens = engine.runner.num_blocks * config.cache.block_size
    finally:
        engine.shutdown()
        del engine
        gc.collect()
    step, fit = fit_step_cost(samples, KERNEL_BAND_FIRSTS)
    dtype = str(config.dtype).removeprefix("torch.")
    if transfer is None:
        on_progress("timing a KV transfer between two processes")
        transfer = probe_transfer(config, dtype)
    profile = Profile(device=device_name(worker.device), source="measured", model=model_dims(model_dir), dtype=dtype,
                      dtype_bytes=torch.tensor([], dtype=config.dtype).element_size(), tp_size=1, step=step,
                      transfer=transfer, kv_cache_tokens=kv_tokens, torch_threads=worker.torch_threads,
                      serving=ServingCost(), fit=fit, key=key)  # fmt: skip
    return profile, samples


def save_samples(samples, path: str | Path) -> None:
    """The measured steps beside the profile (each shape's counts, its seconds and its prefill chunks): the
    fit's evidence."""
    rows = [{**dataclasses.asdict(s.shape), "seconds": s.seconds, "chunks": s.chunks} for s in samples]
    Path(path).write_text(json.dumps(rows) + "\n")


def load_samples(path: str | Path) -> list:
    return [_sample(row) for row in json.loads(Path(path).read_text())]


def _sample(row: dict):
    from costmodel import StepShape
    from planner.fit import StepSample

    return StepSample(StepShape.from_record(row), row["seconds"], tuple(tuple(c) for c in row.get("chunks", ())))


def probe_transfer(config, dtype: str) -> TransferCost:
    from kvtransfer import KVSpec
    from planner.transfer_probe import measure_transfer

    m = config.model
    spec = KVSpec("profile", dtype, config.cache.block_size, m.num_layers, m.num_kv_heads, m.head_dim)
    return measure_transfer(spec)


def _engine_source_hash() -> str:
    import engine

    digest = hashlib.blake2b(digest_size=8)
    for path in sorted(Path(engine.__file__).parent.rglob("*.py")):
        digest.update(path.read_bytes())
    return digest.hexdigest()


def device_name(device: str) -> str:
    """The CPU with its enabled extensions, or the GPU's name: what a measured profile is of."""
    if device == "cpu":
        from engine.cpu_features import cpu_features

        return cpu_features().signature()
    import torch

    return torch.cuda.get_device_name() if torch.cuda.is_available() else "no GPU"


def _cache_dir() -> Path:
    root = os.environ.get("TANDEM_CACHE_DIR") or Path.home() / ".cache" / "tandem"
    return Path(root) / "profiles"
