"""A worker's performance profile: how long its steps take, how fast its KV moves, how much KV it holds.

One profile describes one kind of worker: a device (a CPU model with its threads, or a GPU type), a
model, a dtype and a tensor-parallel size. It comes either from steps measured on the machine at hand
(`source = "measured"`, `tandem profile`, with the fit's residuals in `fit`) or from a device's
published figures (`source = "published"`, `costmodel.devices`, with its assumptions in `notes`).

Saved as JSON; `key` holds what a measured profile depends on, so a cache can tell when it is stale.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from costmodel.model_dims import ModelDims
from costmodel.serving_cost import Neighbours, ServingCost
from costmodel.step_cost import StepCost
from costmodel.step_shape import StepShape
from costmodel.transfer_cost import TransferCost

FORMAT = 1


@dataclass(frozen=True)
class FitReport:
    """How well the fitted terms reproduce the measured steps: relative errors |predicted - measured| / measured."""

    points: int
    median_abs_error: float
    p90_abs_error: float
    max_abs_error: float
    worst: tuple[tuple[str, float, float], ...] = ()  # (shape, measured s, predicted s) of the worst points

    def to_dict(self) -> dict:
        return {"points": self.points, "median_abs_error": self.median_abs_error, "p90_abs_error": self.p90_abs_error,
                "max_abs_error": self.max_abs_error, "worst": [list(w) for w in self.worst]}  # fmt: skip

    @classmethod
    def from_dict(cls, data: dict) -> "FitReport":
        worst = tuple((str(s), float(m), float(p)) for s, m, p in data.get("worst", ()))
        return cls(int(data["points"]), float(data["median_abs_error"]), float(data["p90_abs_error"]),
                   float(data["max_abs_error"]), worst)  # fmt: skip


@dataclass(frozen=True)
class Profile:
    device: str  # "AMD EPYC [avx2 fma avx512f avx512_bf16]" or "H100-SXM"
    source: str  # "measured" | "published"
    model: ModelDims
    dtype: str  # "bfloat16", "float32", ...
    tp_size: int
    step: StepCost
    transfer: TransferCost
    kv_cache_tokens: int  # KV capacity of one worker (all its ranks), in tokens
    dtype_bytes: int = 2
    torch_threads: int | None = None  # CPU: threads per rank it was measured with
    serving: ServingCost = field(default_factory=ServingCost)
    fit: FitReport | None = None
    key: tuple[str, ...] = ()  # what a measured profile depends on (device, threads, kernels, ...)
    notes: tuple[str, ...] = ()  # assumptions (a published profile's efficiency factors)
    price_per_hour: float | None = None  # per worker (all its devices), when the operator gave one

    def __post_init__(self):
        if self.source not in ("measured", "published"):
            raise ValueError(f"profile source must be 'measured' or 'published', got {self.source!r}")
        if self.tp_size < 1 or self.kv_cache_tokens < 1:
            raise ValueError(f"a profile needs tp_size >= 1 and kv_cache_tokens >= 1 (got {self.tp_size}, "
                             f"{self.kv_cache_tokens})")  # fmt: skip

    @property
    def kv_bytes_per_token(self) -> int:
        return self.model.kv_bytes_per_token(self.dtype_bytes)

    @property
    def label(self) -> str:
        threads = f", {self.torch_threads} thread(s)" if self.torch_threads else ""
        return f"{self.device} tp{self.tp_size}{threads} ({self.source})"

    def step_seconds(self, shape: StepShape) -> float:
        return self.step.seconds(shape)

    def served_step_seconds(self, shape: StepShape, prompt_tokens: int, neighbours: Neighbours | None,
                            sends_kv: bool = False) -> float:  # fmt: skip
        """A step as a served worker takes it (what the simulator charges): its price times serving's factor for
        its share of `prompt_tokens` beside `neighbours` (None: alone on its host), plus the prompt's contention,
        its time per sampled row (`ServingCost`, either sign: never below 0) and, on a prefill worker
        (`sends_kv`), the time its prompt tokens' KV takes to stream out."""
        serving = self.serving
        factor = serving.factor_for(neighbours, prompt_tokens / max(shape.tokens, 1))
        sending = serving.kv_send(prompt_tokens) if sends_kv else 0.0
        return max(0.0, self.step_seconds(shape) * factor + serving.prompt_contention(neighbours, prompt_tokens)
                   + serving.per_rows(shape.sampled_rows) + sending)  # fmt: skip

    def transfer_seconds(self, num_tokens: int) -> float:
        """Moving the KV of `num_tokens` tokens from a prefill worker to a decode worker."""
        return self.transfer.seconds(num_tokens * self.kv_bytes_per_token)

    # ---- JSON ----------------------------------------------------------------
    def to_dict(self) -> dict:
        return {
            "format": FORMAT, "device": self.device, "source": self.source, "model": self.model.to_dict(),
            "dtype": self.dtype, "dtype_bytes": self.dtype_bytes, "tp_size": self.tp_size,
            "torch_threads": self.torch_threads, "step": self.step.to_dict(), "transfer": self.transfer.to_dict(),
            "kv_cache_tokens": self.kv_cache_tokens, "serving": self.serving.to_dict(),
            "fit": self.fit.to_dict() if self.fit else None, "key": list(self.key), "notes": list(self.notes),
            "price_per_hour": self.price_per_hour,
        }  # fmt: skip

    @classmethod
    def from_dict(cls, data: dict) -> "Profile":
        if data.get("format") != FORMAT:
            raise ValueError(f"profile format {data.get('format')!r} is not {FORMAT}: measure it again")
        return cls(
            device=data["device"], source=data["source"], model=ModelDims.from_dict(data["model"]),
            dtype=data["dtype"], dtype_bytes=int(data["dtype_bytes"]), tp_size=int(data["tp_size"]),
            torch_threads=data.get("torch_threads"), step=StepCost.from_dict(data["step"]),
            transfer=TransferCost.from_dict(data["transfer"]), kv_cache_tokens=int(data["kv_cache_tokens"]),
            serving=ServingCost.from_dict(data.get("serving") or {}),
            fit=FitReport.from_dict(data["fit"]) if data.get("fit") else None, key=tuple(data.get("key", ())),
            notes=tuple(data.get("notes", ())), price_per_hour=data.get("price_per_hour"),
        )  # fmt: skip

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=1) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> "Profile":
        try:
            data = json.loads(Path(path).read_text())
        except OSError as err:
            raise ValueError(f"cannot read profile {path}: {err.strerror}") from None
        except json.JSONDecodeError as err:
            raise ValueError(f"profile {path} is not JSON: {err}") from None
        try:
            return cls.from_dict(data)
        except (KeyError, TypeError, ValueError) as err:
            raise ValueError(f"profile {path}: {err}") from None
