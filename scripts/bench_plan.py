"""Is the performance model right? Real layouts under `vllm bench serve` against `tandem simulate`'s prediction
of the same argument string.

For each layout (flags of `tandem serve`) the script starts the real deployment (`tandem serve`, embedded
local Ray, one at a time), drives it with vLLM's own load generator on each workload (vLLM's flags; a seed
of its own per workload, so no run finds another's prompts in the prefix cache), then runs
`tandem simulate` with the same layout and workload flags on the profile of this machine's workers for
that layout, and compares the keys both write. The step costs are measured at the script's start
(`tandem profile --refresh`), serving's costs for each layout's workers just before the layout is measured
(`tandem profile --serving`, kept in the pass's folder): this VM drifts by 10-40% within an hour, and a
calibration an hour old measures the drift as much as the model.

    TTFT p50 / p90, TPOT p50 / p90, output throughput: predicted, measured, error = predicted / measured - 1

Layouts: the default (one colocated worker on every core), 1 prefill + 1 decode worker on a core each,
and two colocated workers on a core each. Workloads: a burst, Poisson arrivals of long prompts, shared
prefixes, long outputs.

    python scripts/bench_plan.py --passes 3 --markdown BENCHMARKS.md
    python scripts/bench_plan.py --layouts default --workloads burst --scale 0.5     # a quick look
    python scripts/bench_plan.py --from /tmp/bench-plan-x,/tmp/bench-plan-y          # re-predict measured passes

Each pass measures every layout under every workload (the same seeds each pass: the same prompts and
arrivals, so what moves between passes is the machine); its folder keeps the measured results and a
manifest and the profiles it calibrated, so `--from` predicts them again after the model changed, without a
server (`--cached-profiles`: on the profiles cached now). Each profile keeps its evidence beside it: the steps
its terms were fitted to (`profile-X.samples.json`) and what its calibration measured
(`profile-X.calibration.json`), so `--from ... --refit` fits both again with the code as it is now (a change
to the cost model's terms, the calibration's fit or the simulator's contention) and predicts on that.

    python scripts/bench_plan.py --from benchmarks/plan-passes/A,benchmarks/plan-passes/B --refit

Every real run's engine steps are traced (`TANDEM_STEP_TRACE`, a folder per layout in the pass's, each run's
window on the host's monotonic clock in the manifest): a table sets them against the model's price of the
same steps (`bench_plan_steps`), which says whether a row's error lies in the steps' prices or around them.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))
from bench_loads import chosen_layout, tandem_serve, vllm_bench  # noqa: E402
from bench_report import add_markdown_option, git_commit, machine_line, record_run, run_text  # noqa: E402
from bench_plan_steps import served_steps, steps_table  # noqa: E402
from cluster_bench.predict import tandem_cli  # noqa: E402
from machine_pace import Pace, machine_pace  # noqa: E402

from costmodel import Profile  # noqa: E402

LAYOUTS = {
    "default": (),
    "1P+1D": ("--num-prefill", "1", "--num-decode", "1", "--torch-threads", "1"),
    "2 colocated x1": ("--num-prefill", "0", "--num-decode", "2", "--torch-threads", "1"),
}
METRICS = (("median_ttft_ms", "TTFT p50"), ("p90_ttft_ms", "TTFT p90"), ("median_tpot_ms", "TPOT p50"),
           ("p90_tpot_ms", "TPOT p90"), ("output_throughput", "out tok/s"))  # fmt: skip
MANIFEST = "run.json"  # what a pass measured: layouts, seeds, scale, when, the commit
COMMON = ("--ignore-eos", "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,90,99")
# A run is measured again (once) when the machine's pace just before or after it is further than this from its
# pace just after the layout's calibration (`machine_pace`): the run would price the machine's drift, not the
# model. The pace itself repeats within about 5% on a steady machine.
PACE_TOLERANCE = 0.10
PACE_SETTLE_S = 5.0
RESEED = 1000  # a run measured again uses its workload's seed plus this


@dataclass(frozen=True)
class Workload:
    name: str
    description: str
    flags: tuple[str, ...]  # vllm bench serve's own, the same for `tandem simulate`


def workloads(scale: float = 1.0) -> list[Workload]:
    def n(count: int) -> str:
        return str(max(4, round(count * scale)))

    return [
        Workload("burst", f"{n(24)} prompts of 200 tokens at once, 48 out",
                 ("--dataset-name", "random", "--random-input-len", "200", "--random-output-len", "48",
                  "--num-prompts", n(24))),
        Workload("poisson-long", f"{n(16)} prompts of 1,536 tokens, Poisson 0.4/s, 200 out",
                 ("--dataset-name", "random", "--random-input-len", "1536", "--random-output-len", "200",
                  "--request-rate", "0.4", "--num-prompts", n(16))),
        Workload("prefixes", f"{n(40)} prompts sharing 8 prefixes of 768 tokens (+48 each), 1.2/s, 64 out",
                 ("--dataset-name", "prefix_repetition", "--prefix-repetition-prefix-len", "768",
                  "--prefix-repetition-suffix-len", "48", "--prefix-repetition-num-prefixes", "8",
                  "--prefix-repetition-output-len", "64", "--request-rate", "1.2", "--num-prompts", n(40))),
        Workload("long-outputs", f"{n(8)} prompts of 128 tokens, Poisson 0.5/s, 512 out",
                 ("--dataset-name", "random", "--random-input-len", "128", "--random-output-len", "512",
                  "--request-rate", "0.5", "--num-prompts", n(8))),
    ]  # fmt: skip


def measured(url: str, tokenizer: str, workload: Workload, seed: int, out: Path) -> dict:
    return vllm_bench(url, tokenizer, (*workload.flags, *COMMON), seed, out, workload.name)


def predicted(layout: tuple[str, ...], workload: Workload, seed: int, out: Path, profile: Path | None) -> dict:
    """`tandem simulate` of the row, on `profile` (None: this machine's cached profiles)."""
    tandem_cli(["simulate", *layout, *workload.flags, *COMMON, "--seed", str(seed), "--result-json", str(out),
                *(["--profile", str(profile)] if profile else [])], f"tandem simulate on {workload.name}", 3600)  # fmt: skip
    return json.loads(out.read_text())


def error(pred: float, real: float) -> float:
    return pred / real - 1 if real else float("nan")


def abs_errors(rows: list[dict], key: str, pred: str = "pred") -> list[float]:
    return [abs(error(r[pred][key], r["real"][key])) for r in rows]


def table(rows: list[dict]) -> str:
    paced = any(r["pace"] for r in rows)
    head = "| layout | workload | " + " | ".join(f"{label} pred / real (err)" for _, label in METRICS) + " |"
    head += " machine pace before / after, vs calibration |" if paced else ""
    lines = [head, "|---|---|" + "---|" * (len(METRICS) + paced)]
    for r in rows:
        cells = [f"{r['pred'][k]:.{1 if k == 'output_throughput' else 0}f} / {r['real'][k]:.{1 if k == 'output_throughput' else 0}f} "
                 f"({error(r['pred'][k], r['real'][k]):+.0%})" for k, _ in METRICS]  # fmt: skip
        cells += [r["pace"] + ("" if r["steady"] else " **unsteady**")] if paced else []
        lines.append(f"| {r['layout']} | {r['workload']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def summary(rows: list[dict]) -> str:
    """The errors over every run; when the machine's pace moved past `PACE_TOLERANCE` around some runs (measured
    twice), also over the steady ones."""
    text = _summary_table(rows)
    steady = [r for r in rows if r["steady"]]
    if len(steady) < len(rows):
        text += (f"\n\nThe {len(steady)} of {len(rows)} runs around which the machine's pace stayed within "
                 f"{PACE_TOLERANCE:.0%} of its calibration's:\n\n" + (_summary_table(steady) if steady else "none"))
    paced = [r for r in rows if "pred_paced" in r]
    if paced:
        text += (f"\n\nThe model on the machine as it ran ({len(paced)} runs: each prediction made again with the "
                 "profile's step costs scaled by the pace probe around the run over its calibration's, "
                 "`paced_profile`; the machine's drift, not the model's error):\n\n"
                 + _summary_table(paced, "pred_paced"))  # fmt: skip
    return text


def _summary_table(rows: list[dict], pred: str = "pred") -> str:
    lines = ["| metric | median abs error | worst | runs within 10% / 25% |", "|---|---|---|---|"]
    for key, label in METRICS:
        errors = abs_errors(rows, key, pred)
        within = f"{sum(e <= 0.10 for e in errors)} / {sum(e <= 0.25 for e in errors)} of {len(errors)}"
        lines.append(f"| {label} | {statistics.median(errors):.0%} | {max(errors):.0%} | {within} |")
    return "\n".join(lines)


def reprofile(threads: list[int]) -> None:
    """This machine's step costs measured again now (`tandem profile --refresh`), for each thread count."""
    for t in threads:
        tandem_cli(["profile", "--refresh", "--torch-threads", str(t)], "tandem profile --refresh")


def calibrate(flags: tuple[str, ...], out: Path) -> None:
    """The profile of a layout's workers with serving's costs measured now, just before the layout is
    (`tandem profile --serving`, written to `out`): the machine drifts by 10-40% within an hour, so a
    prediction priced by a calibration of an hour before measures the drift as much as the model."""
    tandem_cli(["profile", "--serving", "--torch-threads", str(layout_threads(flags)), "-o", str(out)],
               "tandem profile --serving")  # fmt: skip


def layout_threads(flags: tuple[str, ...]) -> int:
    return int(flags[flags.index("--torch-threads") + 1]) if "--torch-threads" in flags else os.cpu_count()


def measure_pass(layouts: dict[str, tuple[str, ...]], chosen: list[Workload], scale: float, tokenizer: str,
                 calibrated: bool) -> Path:  # fmt: skip
    """Every layout under every workload, measured now (each layout's profile calibrated just before it when
    `calibrated`); the folder of their results, with its manifest."""
    work, started = Path(tempfile.mkdtemp(prefix="bench-plan-")), datetime.datetime.now()
    seeds = {w.name: seed for seed, w in enumerate(chosen, start=101)}
    chosen_default, profiles, paces = "", {}, {}
    for i, (name, flags) in enumerate(layouts.items()):
        if calibrated:
            profiles[name] = result_name("profile", name)
            calibrate(flags, work / profiles[name])
        threads = layout_threads(flags)
        reference = settled_pace(threads)
        paces[name] = {"reference": reference.as_dict(), "runs": {}}
        log, traces = work / f"serve-{i}.log", work / trace_folder(name)
        # Every served engine step traced (a JSON line each: `runtime.step_trace`), to tell afterwards whether a
        # row's error lies in the steps' prices or around them (`served_steps`).
        with tandem_serve(None, log, flags=flags, env={"TANDEM_STEP_TRACE": str(traces)}) as url:
            for workload in chosen:
                out = work / result_name("real", name, workload.name)
                attempts = paces[name]["runs"][workload.name] = []
                while len(attempts) < 2 and (not attempts or unsteady(attempts[-1], reference)):
                    # Measured again: other prompts (a seed of its own), or they would be in the prefix cache.
                    seed, before = seeds[workload.name] + RESEED * len(attempts), settled_pace(threads)
                    start = time.monotonic()  # the step traces' clock (one per host)
                    real = measured(url, tokenizer, workload, seed, out)
                    window = [start, time.monotonic()]
                    after = settled_pace(threads)
                    attempts.append({"seed": seed, "before": before.as_dict(), "after": after.as_dict(),
                                     "window": window})  # fmt: skip
                    print(f"measured {name} / {workload.name}: {real['completed']} completed, machine pace "
                          f"{pace_text(attempts[-1], reference)} of its calibration's", flush=True)  # fmt: skip
        chosen_default = chosen_layout(log) if name == "default" else chosen_default
    manifest = {"measured": f"{started:%Y-%m-%d %H:%M}", "commit": git_commit(), "scale": scale,
                "layouts": {n: list(f) for n, f in layouts.items()}, "seeds": seeds, "chosen_default": chosen_default,
                "profiles": profiles, "pace": paces}  # fmt: skip
    (work / MANIFEST).write_text(json.dumps(manifest, indent=1))
    return work


def settled_pace(threads: int) -> Pace:
    """The machine's pace once what just ended has settled (a run's or a calibration's processes exiting: in
    the first passes that measured it, a pace taken at once after a run was up to 15% slower than the one
    taken seconds later, before the next run)."""
    time.sleep(PACE_SETTLE_S)
    return machine_pace(threads)


def drifts(attempt: dict, reference: Pace) -> tuple[float, float]:
    """The machine's pace just before and just after a run, each relative to its calibration's (`Pace.drift`)."""
    return Pace(**attempt["before"]).drift(reference), Pace(**attempt["after"]).drift(reference)


def unsteady(attempt: dict, reference: Pace) -> bool:
    return any(abs(d) > PACE_TOLERANCE for d in drifts(attempt, reference))


def pace_text(attempt: dict, reference: Pace) -> str:
    return " / ".join(f"{d:+.0%}" for d in drifts(attempt, reference))


def _attempts(manifest: dict, layout: str, workload: str) -> list[dict]:
    """A row's runs with the machine's pace around each (and the seed of one measured again); none for a pass
    measured before the pace was."""
    return manifest.get("pace", {}).get(layout, {}).get("runs", {}).get(workload, [])


def run_pace(manifest: dict, layout: str, workload: str) -> tuple[str, bool]:
    """How the machine's pace stood around a row's (last) run, as text, and whether it stayed steady; ("", True)
    for a pass measured before the pace was."""
    attempts = _attempts(manifest, layout, workload)
    if not attempts:
        return "", True
    reference = Pace(**manifest["pace"][layout]["reference"])
    again = " (measured again)" if len(attempts) > 1 else ""
    return pace_text(attempts[-1], reference) + again, not unsteady(attempts[-1], reference)


def cached_again(manifest: dict, layout: str, workload: str) -> bool:
    """A run measured again on its first run's prompts (the passes of 2026-11-27 15:37 and 16:07, before runs
    measured again took a seed of their own): they were in the prefix cache, so it measured the cache."""
    attempts = _attempts(manifest, layout, workload)
    return len(attempts) > 1 and "seed" not in attempts[-1]


def run_seed(manifest: dict, layout: str, workload: str) -> int:
    """The seed of a row's (last) run: its workload's, or the one a run measured again had."""
    attempts = _attempts(manifest, layout, workload)
    return attempts[-1].get("seed", manifest["seeds"][workload]) if attempts else manifest["seeds"][workload]


def read_pass(folder: Path) -> tuple[dict, list[dict]]:
    """A measured pass's manifest and its rows (layout, workload, seed, real)."""
    path = folder / MANIFEST
    if not path.exists():
        raise SystemExit(f"{folder}: no {MANIFEST}: not a finished pass of this script (its seeds are unknown)")
    manifest = json.loads(path.read_text())
    rows = []
    for name in manifest["layouts"]:
        for workload in workloads(manifest["scale"]):
            real = folder / result_name("real", name, workload.name)
            if workload.name in manifest["seeds"] and real.exists() and not cached_again(manifest, name, workload.name):
                pace, steady = run_pace(manifest, name, workload.name)
                rows.append({"layout": name, "workload": workload.name, "seed": run_seed(manifest, name, workload.name),
                             "real": json.loads(real.read_text()), "pace": pace, "steady": steady})  # fmt: skip
    if not rows:
        raise SystemExit(f"{folder}: no measured results (real-*.json) in it")
    return manifest, rows


def predict_pass(folder: Path, manifest: dict, rows: list[dict], cached_profiles: bool, refit: bool = False) -> None:
    """Each row's prediction, made now (written beside the measured result), on `pass_profile` (`refit`: fitted
    again from its evidence first, `refitted`)."""
    by_name = {w.name: w for w in workloads(manifest["scale"])}
    profiles = {}
    for name in manifest["layouts"]:
        profile = pass_profile(folder, manifest, name, cached_profiles)
        profiles[name] = refitted(profile) if refit and profile is not None else profile
    for r in rows:
        layout = tuple(manifest["layouts"][r["layout"]])
        workload = by_name[r["workload"]]
        r["pred"] = predicted(layout, workload, r["seed"], folder / result_name("pred", r["layout"], workload.name),
                              profiles[r["layout"]])  # fmt: skip
        attempts = _attempts(manifest, r["layout"], r["workload"])
        if attempts and profiles[r["layout"]] is not None:
            reference = Pace(**manifest["pace"][r["layout"]]["reference"])
            paced = paced_profile(profiles[r["layout"]], attempts[-1], reference,
                                  folder / result_name("paced-profile", r["layout"], workload.name))  # fmt: skip
            out = folder / result_name("pred-paced", r["layout"], workload.name)
            r["pred_paced"] = predicted(layout, workload, r["seed"], out, paced)
        window = attempts[-1].get("window") if attempts else None
        if window and profiles[r["layout"]] is not None:
            traced = folder / trace_folder(r["layout"])
            r["served_steps"] = served_steps(Profile.load(profiles[r["layout"]]), traced, tuple(window))


# The step cost terms a memory-bound (decode-like) piece of work paces, and the compute-bound (prefill-like) ones.
DECODE_TERMS = ("fixed_s", "weights_s", "per_sampled_row_s", "per_sequence_s", "per_decode_context_token_s",
                "per_longest_decode_context_s", "kernel_bands")  # fmt: skip
PREFILL_TERMS = ("per_token_s", "per_token_comm_s", "per_attention_pair_s", "per_prefill_context_token_s",
                 "per_prefix_attention_pair_s", "per_small_step_token_s")


def paced_profile(path: Path, attempt: dict, reference: Pace, out: Path) -> Path:
    """The profile at `path` on the machine as it ran around one run: each step cost term scaled by the pace
    probe's piece of its kind (`DECODE_TERMS`, `PREFILL_TERMS`), the mean of before and after the run over its
    value just after the calibration; written to `out`. What is left of the error is the model's."""
    import dataclasses

    before, after = Pace(**attempt["before"]), Pace(**attempt["after"])
    decode = (before.decode_ms + after.decode_ms) / 2 / reference.decode_ms
    prefill = (before.prefill_ms + after.prefill_ms) / 2 / reference.prefill_ms
    profile = Profile.load(path)
    pace = {**dict.fromkeys(DECODE_TERMS, decode), **dict.fromkeys(PREFILL_TERMS, prefill)}
    step = profile.step.scaled(pace.__getitem__)  # a new term: a KeyError until placed here
    dataclasses.replace(profile, step=step).save(out)
    return out


def refitted(path: Path) -> Path:
    """The pass's profile at `path` fitted again by the code as it is now: the step terms to the steps it was
    measured on, serving's costs to what its calibration measured; written beside it as refit-<name>."""
    import dataclasses

    from cluster.calibration_record import CalibrationRecord
    from cluster.plan_cli import evidence_path
    from cluster.serving_calibration import fitted
    from costmodel import ServingCost
    from planner.fit import fit_step_cost
    from planner.local_profile import load_samples
    from planner.profiler import KERNEL_BAND_FIRSTS

    samples, record = evidence_path(path, "samples"), evidence_path(path, "calibration")  # as `profile -o` kept them
    missing = [p.name for p in (samples, record) if not p.is_file()]
    if missing:
        raise SystemExit(f"--refit: {', '.join(missing)} not kept beside {path} (a pass measured before they were)")
    step, fit = fit_step_cost(load_samples(samples), KERNEL_BAND_FIRSTS)
    profile = dataclasses.replace(Profile.load(path), step=step, fit=fit, serving=ServingCost())
    out = path.with_name(f"refit-{path.name}")
    fitted(profile, CalibrationRecord.load(record)).save(out)
    return out


def pass_profile(folder: Path, manifest: dict, layout: str, cached_profiles: bool) -> Path | None:
    """The profile the pass calibrated for `layout`; None (the profiles cached now) with `cached_profiles`, or
    for a pass that calibrated none."""
    name = None if cached_profiles else manifest.get("profiles", {}).get(layout)
    return folder / name if name else None


def trace_folder(layout: str) -> str:
    """Where a layout's workers trace their steps in the pass's folder."""
    return f"traces-{layout}".replace(" ", "_")


def result_name(kind: str, layout: str, workload: str = "") -> str:
    return f"{kind}-{layout}{'-' + workload if workload else ''}.json".replace(" ", "_")


def over_passes(passes: list[list[dict]]) -> str:
    """Each metric's median |error| in every pass, their median, the worst error of any pass, and how far the
    machine itself moved: per layout and workload, the largest measured value over the smallest of all
    passes, less 1 (the median over them, and the largest)."""
    lines = ["| metric | median abs error, pass by pass | median of the passes' medians | worst of any pass | "
             "measured spread between passes: median, largest |", "|---|---|---|---|---|"]  # fmt: skip
    for key, label in METRICS:
        errors = [abs_errors(rows, key) for rows in passes]
        medians = [statistics.median(e) for e in errors]
        spreads = _spreads(passes, key)
        lines.append(f"| {label} | {' / '.join(f'{m:.0%}' for m in medians)} | {statistics.median(medians):.0%} | "
                     f"{max(max(e) for e in errors):.0%} | {statistics.median(spreads):.0%}, {max(spreads):.0%} |")  # fmt: skip
    return "\n".join(lines)


def _spreads(passes: list[list[dict]], key: str) -> list[float]:
    measured: dict[tuple[str, str], list[float]] = {}
    for rows in passes:
        for r in rows:
            measured.setdefault((r["layout"], r["workload"]), []).append(r["real"][key])
    return [max(v) / min(v) - 1 for v in measured.values() if len(v) == len(passes) and min(v) > 0] or [0.0]


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layouts", default=",".join(LAYOUTS), help=f"some of: {', '.join(LAYOUTS)}")
    p.add_argument("--workloads", default=",".join(w.name for w in workloads()))
    p.add_argument("--scale", type=float, default=1.0, help="prompts per workload, times this")
    p.add_argument("--passes", type=int, default=1, help="measure everything this many times (the machine's noise)")
    p.add_argument("--from", dest="from_", metavar="DIR[,DIR...]",
                   help="predict the measured results of earlier passes (their folders) instead of measuring: "
                        "their manifests say the layouts, workloads, seeds and scale (the flags above do not)")
    p.add_argument("--no-reprofile", action="store_true",
                   help="measure no profile: predict with the profiles cached now (by default the step costs are "
                        "measured at the start and each layout's serving costs just before it is measured)")
    p.add_argument("--cached-profiles", action="store_true",
                   help="with --from: predict with the profiles cached now, not those each pass calibrated")
    p.add_argument("--refit", action="store_true",
                   help="with --from: fit each pass's profiles again from the evidence kept beside them (the steps "
                        "measured, the calibration's measurements) with the code as it is now, then predict")
    add_markdown_option(p)
    return p.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.passes < 1:
        raise SystemExit(f"--passes: at least 1, got {args.passes}")
    if args.refit and not args.from_:
        raise SystemExit("--refit refits the profiles of earlier passes: give them with --from")
    if args.from_:
        folders = [Path(f) for f in args.from_.split(",")]
    else:
        from engine.model_source import resolve_model

        tokenizer = str(resolve_model(None))
        chosen = [w for w in workloads(args.scale) if w.name in args.workloads.split(",")]
        layouts = {name: LAYOUTS[name] for name in args.layouts.split(",")}
        if not args.no_reprofile:
            reprofile(sorted({layout_threads(f) for f in layouts.values()}))
        folders = [measure_pass(layouts, chosen, args.scale, tokenizer, not args.no_reprofile)
                   for _ in range(args.passes)]  # fmt: skip
    passes, texts, manifest = [], [], {}
    for folder in folders:
        manifest, rows = read_pass(folder)
        predict_pass(folder, manifest, rows, args.cached_profiles, args.refit)
        passes.append(rows)
        texts.append(f"Pass {len(passes)}: measured {manifest['measured']} (commit {manifest['commit']}), results "
                     f"{folder}\n\n{table(rows)}\n\n{summary(rows)}")  # fmt: skip
        if steps := steps_table(rows):
            texts.append("The served steps of each run (traced) against the model's price of the same steps (the "
                         "profile, serving's factors and its time per sampled row: `scripts/bench_plan_steps.py`):"
                         f"\n\n{steps}")  # fmt: skip
    if len(passes) > 1:
        texts.append(f"Over the {len(passes)} passes:\n\n{over_passes(passes)}")
        steady = [[r for r in rows if r["steady"]] for rows in passes]
        if sum(map(len, steady)) < sum(map(len, passes)) and all(steady):
            texts.append(f"Over the runs of the {len(passes)} passes around which the machine's pace stayed within "
                         f"{PACE_TOLERANCE:.0%} of its calibration's:\n\n{over_passes(steady)}")  # fmt: skip
    text = "\n\n".join(texts)
    print(text)
    if args.markdown:
        record = run_text("bench_plan.py", sys.argv[1:], machine_line(), details(manifest), text)
        record_run(args.markdown, "bench_plan.py", record)


def details(manifest: dict) -> str:
    chosen_default = manifest["chosen_default"]
    layouts = "; ".join(f"`{n}`: `tandem serve {' '.join(f)}`" for n, f in manifest["layouts"].items())
    chosen = [w for w in workloads(manifest["scale"]) if w.name in manifest["seeds"]]
    return ("Layouts: " + layouts + (f" (the default here: {chosen_default})" if chosen_default else "")
            + ". Workloads (`vllm bench serve` flags, with `--ignore-eos`; the same flags to `tandem simulate`):\n"
            + "\n".join(f"- `{w.name}`: {w.description}: `{' '.join(w.flags)}`" for w in chosen)
            + "\n\nerror = predicted / measured - 1; the target: median |error| <= 10% on every metric, none "
            "worse than 25%. Predictions are made when the script runs, each on the profile its pass calibrated for "
            "the layout just before measuring it (with --cached-profiles, or for a pass that calibrated none: the "
            "profiles cached then).")  # fmt: skip


if __name__ == "__main__":
    main()
