"""What the served steps of a bench_plan run say: whether a row's error lies in the steps' prices or around them.

Each real run of `scripts/bench_plan.py` serves with every worker tracing its engine steps
(`runtime.step_trace`, one folder per layout, the run's window on the host's monotonic clock kept in the
manifest). For the steps inside a run's window this sets their served seconds against what the simulator
would charge for the same shapes (`Profile.served_step_seconds`: the profile's price times serving's factor
for the step's neighbours and prompt share, plus its time per sampled row). A ratio near 1 puts the row's error
in the scheduling or the time around the steps; far from it, in the prices themselves (or the machine's
drift: the pace columns say which).

The neighbours are read from the traces as the calibration reads them (`cluster.calibration_steps.overlap`):
the share of a step the other workers spent in steps, all of them (busy) and those that decode (decoding).
The simulator counts a neighbour with work, not only one inside a step, so on a host of several workers this
prices a little lower than the simulation does.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from cluster.calibration_steps import loaded_steps, overlap, shape
from costmodel import Neighbours, Profile


@dataclass(frozen=True)
class ServedSteps:
    steps: int
    served_s: float  # the traced steps' seconds, summed
    priced_s: float  # the model's price of the same steps, summed
    decode_ratio: float | None  # served / priced over the decode-only steps (None: none)
    prompt_ratio: float | None  # ... over the steps with prompt tokens

    @property
    def ratio(self) -> float:
        return self.served_s / self.priced_s


def served_steps(profile: Profile, traces: Path, window: tuple[float, float]) -> ServedSteps | None:
    """The steps of every worker traced in `traces` that began inside `window`; None when there are none."""
    by_worker = loaded_steps(traces, *window)
    sums = {True: [0.0, 0.0], False: [0.0, 0.0]}  # prompt tokens or not -> [served, priced]
    count = 0
    for name, lines in by_worker.items():
        others = {k: v for k, v in by_worker.items() if k != name}
        decoders = [v for k, v in others.items() if not k.startswith("prefill")]
        for line in lines:
            neighbours = None
            if others:
                busy = overlap(line, list(others.values()))
                decoding = overlap(line, decoders) * len(decoders) / len(others) if decoders else 0.0
                neighbours = Neighbours(busy=busy, decoding=decoding)
            sums[line["prompt_tokens"] > 0][0] += line["s"]
            sums[line["prompt_tokens"] > 0][1] += profile.served_step_seconds(
                shape(line), line["prompt_tokens"], neighbours, sends_kv=name.startswith("prefill"))
            count += 1
    if not count:
        return None
    served, priced_total = (sums[True][i] + sums[False][i] for i in (0, 1))

    def ratio(kind: bool) -> float | None:
        return sums[kind][0] / sums[kind][1] if sums[kind][1] > 0 else None

    return ServedSteps(count, served, priced_total, ratio(False), ratio(True))


def steps_table(rows: list[dict]) -> str:
    """A line per row whose run was traced (`row["served_steps"]`); "" when none was."""
    traced = [r for r in rows if r.get("served_steps")]
    if not traced:
        return ""

    def cell(value: float | None) -> str:
        return "-" if value is None else f"{value:.2f}"

    lines = ["| layout | workload | steps | served / priced, all | decode-only steps | steps with prompt tokens |",
             "|---|---|---|---|---|---|"]  # fmt: skip
    for r in traced:
        s = r["served_steps"]
        lines.append(f"| {r['layout']} | {r['workload']} | {s.steps} | {s.ratio:.2f} ({s.served_s:.1f} / "
                     f"{s.priced_s:.1f} s) | {cell(s.decode_ratio)} | {cell(s.prompt_ratio)} |")  # fmt: skip
    return "\n".join(lines)
