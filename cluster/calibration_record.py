"""What a serving calibration measured, kept as JSON beside the profile it calibrated, so that the fit can be
made again from it after the model changed (`scripts/bench_plan.py --from ... --refit`), without a server.

    record = CalibrationRecord(replicas, idle, requests, loaded, beside)
    record.save(path);  CalibrationRecord.load(path)

The fit itself is `cluster.serving_calibration.fitted(profile, record)`: one function from the measurements
to the serving costs, whether they were measured a second ago or an hour ago on another commit.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

from cluster.calibration_beside import BesideRound
from cluster.calibration_client import Outcome
from planner.workload import SimRequest

VERSION = 1


@dataclass
class CalibrationRecord:
    """The phases of one calibration (`cluster.serving_calibration`'s module doc): `replicas` colocated workers;
    the idle requests' and the loaded phase's outcomes, the load's requests, the beside rounds (None: one
    worker, no beside phase), and each worker's engine steps while the load ran (`runtime.step_trace` lines;
    None: a record of before they were kept)."""

    replicas: int
    idle: list[Outcome]
    requests: list[SimRequest]
    loaded: list[Outcome]
    beside: list[BesideRound] | None = None
    loaded_steps: dict[str, list[dict]] | None = None

    def idle_prefill_spread(self) -> float | None:
        """How far the machine moved under the calibration: its idle prefills (the same prompt's compute each
        time, half before the load and half after) as the second-largest over the second-smallest, so that one
        preempted prefill moves nothing. None without the worker's phases (or fewer than four idle requests)."""
        prefills = sorted(o.phases.get("prefill_s", 0.0) for o in self.idle)
        if len(prefills) < 4 or prefills[0] <= 0:
            return None
        return prefills[-2] / prefills[1]

    def save(self, path: str | Path) -> None:
        data = {"version": VERSION, "replicas": self.replicas, "idle": [dataclasses.asdict(o) for o in self.idle],
                "requests": [[r.arrival_s, list(r.prompt), r.output_len] for r in self.requests],
                "loaded": [dataclasses.asdict(o) for o in self.loaded],
                "beside": None if self.beside is None else [_round_dict(r) for r in self.beside],
                "loaded_steps": self.loaded_steps}  # fmt: skip
        Path(path).write_text(json.dumps(data) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> "CalibrationRecord":
        data = json.loads(Path(path).read_text())
        if data.get("version") != VERSION:
            raise ValueError(f"{path}: a calibration record of version {data.get('version')}, not {VERSION}")
        beside = data["beside"]
        return cls(data["replicas"], [Outcome(**o) for o in data["idle"]],
                   [SimRequest(a, tuple(p), n) for a, p, n in data["requests"]],
                   [Outcome(**o) for o in data["loaded"]],
                   None if beside is None else [_round(r) for r in beside], data.get("loaded_steps"))  # fmt: skip


def _round_dict(r: BesideRound) -> dict:
    return {"stream": dataclasses.asdict(r.stream), "beside": [dataclasses.asdict(o) for o in r.beside],
            "quiet": [dataclasses.asdict(o) for o in r.quiet], "alone_s": r.alone_s}  # fmt: skip


def _round(data: dict) -> BesideRound:
    return BesideRound(Outcome(**data["stream"]), [Outcome(**o) for o in data["beside"]],
                       [Outcome(**o) for o in data["quiet"]], data["alone_s"])  # fmt: skip
