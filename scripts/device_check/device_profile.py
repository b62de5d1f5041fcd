"""The engine's measured step costs on this device (`tandem profile`'s measurement) against the profile the
planner derives from the device's published figures (`costmodel.devices`), over the same measured steps.

    python -m device_check.launch device_check.device_profile --device cuda --model-dir DIR --out FILE \
        [--published h200] [--dry-run]

Until a GPU is lent, a plan for GPU pools rests on the published-figures profile and its stated efficiency
factors; this step says how far those land from the steps the engine really takes on the lent GPU, term
by term, and writes the measured profile (FILE, the JSON `tandem plan --profile` takes) to replace it,
with the measured steps beside it (FILE's stem + .samples.json).
The KV transfer is timed between two processes when pyzmq is importable; without it (the GPU image) the
published figure stands in, and a figure says so. A dry run profiles the tiny stand-in on the CPU with
the tiny grid: it proves the step works, its figures mean nothing.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from .step_io import figure, importable

# Substrings of torch.cuda.get_device_name() -> the name of the published figures (costmodel.devices.DEVICES).
GPU_NAMES = {"H200": "h200", "H100": "h100", "A100": "a100", "L40S": "l40s"}


def published_name(gpu_name: str) -> str | None:
    return next((name for marker, name in GPU_NAMES.items() if marker in gpu_name.upper()), None)


def step_kind(shape) -> str:
    """decode (no prefill chunk), prefill (no decode row) or mixed."""
    if shape.prefill_attention_pairs == 0:
        return "decode"
    return "prefill" if shape.decode_context_tokens == 0 else "mixed"


def errors_by_kind(cost, samples) -> dict[str, tuple[int, float]]:
    """Per kind of step: (steps, median |predicted - measured| / measured)."""
    import numpy as np

    kinds: dict[str, list[float]] = {}
    for s in samples:
        kinds.setdefault(step_kind(s.shape), []).append(abs(cost.seconds(s.shape) - s.seconds) / s.seconds)
    return {kind: (len(errs), float(np.median(errs))) for kind, errs in sorted(kinds.items())}


def compare(measured, published, samples) -> None:
    """Figures: how the published-figures profile predicts the measured steps, overall, per kind, per term."""
    from planner.fit import report

    rep = report(published.step, samples, worst=3)
    figure("published profile's error on the measured steps",
           f"median {rep.median_abs_error:.0%}, p90 {rep.p90_abs_error:.0%}, max {rep.max_abs_error:.0%} "
           f"({published.device}, {published.notes[-1]})")  # fmt: skip
    fitted, derived = errors_by_kind(measured.step, samples), errors_by_kind(published.step, samples)
    for kind, (steps, error) in derived.items():
        figure(f"{kind} steps ({steps})", f"measured fit {fitted[kind][1]:.0%}, published {error:.0%} median error")
    ours, theirs = measured.step.to_dict(), published.step.to_dict()
    figure("measured kernel bands", measured.step.describe_kernel_bands() or "none")
    for term, value in ours.items():
        if term != "kernel_bands" and (value or theirs[term]):
            figure(f"term {term}", f"measured {value:.3g} s, published {theirs[term]:.3g} s")
    for shape, seconds, predicted in rep.worst:
        figure(f"published, worst: {shape}", f"measured {seconds * 1e3:.2f} ms, published {predicted * 1e3:.2f} ms")


def measure(args):
    from costmodel import devices
    from planner.local_profile import LocalWorker, measure_profile, model_dims, profile_key
    from planner.profiler import ProfileGrid

    dtype = "float32" if args.dry_run else "bfloat16"
    worker = LocalWorker(model=args.model_dir, dtype=dtype, torch_threads=args.torch_threads, device=args.device)
    dims = model_dims(args.model_dir)
    published = devices.published_profile(args.published, dims) if args.published else None
    transfer = None
    if not importable("zmq"):  # the transfer probe's control messages are ZMQ
        stand_in = published or devices.published_profile("h100", dims)
        transfer = stand_in.transfer
        figure("KV transfer", f"{stand_in.device}'s published figure (pyzmq is not importable: not timed here)")
    grid = ProfileGrid.tiny() if args.dry_run else ProfileGrid()
    key = profile_key(worker, args.model_dir)
    profile, samples = measure_profile(worker, args.model_dir, key, grid, lambda what: print(what, flush=True),
                                       transfer)  # fmt: skip
    return profile, samples, published


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--model-dir", required=True)
    parser.add_argument("--out", required=True, help="the measured profile's JSON")
    parser.add_argument("--published", default=None, help="published figures to compare (default: by the GPU's name)")
    parser.add_argument("--torch-threads", type=int, default=1)
    parser.add_argument("--dry-run", action="store_true")
    args = parser.parse_args()
    if args.published is None and args.device != "cpu":
        import torch

        args.published = published_name(torch.cuda.get_device_name())
    from planner.local_profile import save_samples

    profile, samples, published = measure(args)
    Path(args.out).write_text(json.dumps(profile.to_dict(), indent=1) + "\n")
    save_samples(samples, Path(args.out).with_suffix(".samples.json"))  # the fit's evidence, to refit elsewhere
    fit = profile.fit
    figure("profile", f"{profile.label}: {fit.points} steps, fit median {fit.median_abs_error:.1%}, "
           f"p90 {fit.p90_abs_error:.1%}, max {fit.max_abs_error:.1%}")  # fmt: skip
    figure("profile file", Path(args.out).name)
    if published is None:
        figure("published profile", f"none known for {profile.device}")
    else:
        compare(profile, published, samples)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
