"""bench_plan's passes: what a measured pass's folder holds, how an earlier one is read back, and the
errors summarised over several passes (the measuring and predicting themselves are the benchmark's run)."""

from __future__ import annotations

import json

import pytest

from scripts import bench_plan

KEYS = [key for key, _ in bench_plan.METRICS]


def _result(value: float) -> dict:
    return {key: value for key in KEYS} | {"completed": 4}


def test_a_folder_without_a_manifest_is_refused_its_seeds_are_unknown(tmp_path):
    (tmp_path / bench_plan.result_name("real", "1P+1D", "burst")).write_text(json.dumps(_result(1.0)))
    with pytest.raises(SystemExit, match="no run.json"):
        bench_plan.read_pass(tmp_path)


def test_a_manifest_names_the_layouts_seeds_and_scale_it_measured(tmp_path):
    long_outputs = bench_plan.workloads(0.5)[3]
    manifest = {"measured": "2026-11-26 20:00", "commit": "abc", "scale": 0.5, "chosen_default": "",
                "layouts": {"mine": ["--num-decode", "3"]}, "seeds": {"long-outputs": 7}}  # fmt: skip
    (tmp_path / bench_plan.MANIFEST).write_text(json.dumps(manifest))
    (tmp_path / bench_plan.result_name("real", "mine", long_outputs.name)).write_text(json.dumps(_result(5.0)))
    read, rows = bench_plan.read_pass(tmp_path)
    assert read == manifest and [(r["layout"], r["workload"], r["seed"]) for r in rows] == [("mine", "long-outputs", 7)]
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / bench_plan.MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(SystemExit, match="no measured results"):
        bench_plan.read_pass(tmp_path / "empty")


def test_a_row_is_predicted_on_the_profile_its_pass_calibrated_for_its_layout(tmp_path):
    manifest = {"profiles": {"2 colocated x1": bench_plan.result_name("profile", "2 colocated x1")}}
    assert bench_plan.pass_profile(tmp_path, manifest, "2 colocated x1", False) == tmp_path / "profile-2_colocated_x1.json"
    assert bench_plan.pass_profile(tmp_path, manifest, "2 colocated x1", True) is None  # --cached-profiles
    assert bench_plan.pass_profile(tmp_path, manifest, "default", False) is None  # calibrated none for it
    assert bench_plan.pass_profile(tmp_path, {}, "default", False) is None  # a pass from before calibrations


def test_over_passes_gives_each_passes_median_their_median_and_the_worst():
    def rows(real: float, *errors):  # one row per error, every metric off by it
        return [{"layout": "l", "workload": f"w{i}", "pred": _result(real * (1 + e)), "real": _result(real)}
                for i, e in enumerate(errors)]  # fmt: skip

    passes = [rows(100.0, 0.05, -0.10, 0.30), rows(100.0, 0.02, 0.04, 0.06), rows(120.0, -0.20, 0.20, 0.12)]
    ttft_p50 = next(line for line in bench_plan.over_passes(passes).splitlines() if line.startswith("| TTFT p50 "))
    assert ttft_p50 == "| TTFT p50 | 10% / 4% / 20% | 10% | 30% | 20%, 20% |"  # the third pass measured 1.2x


def test_refit_fits_a_passes_profile_again_from_the_evidence_kept_beside_it(tmp_path):
    """--refit: the step terms from the kept steps, serving's costs from the kept calibration, whatever the saved
    profile said (here a stale step_factor of 9), written beside it; a pass without the evidence is refused."""
    import dataclasses

    from cluster.calibration_record import CalibrationRecord
    from cluster.serving_calibration import fitted
    from costmodel import Profile, ServingCost
    from planner.fit import StepSample
    from planner.local_profile import save_samples
    from tests.cluster.test_serving_calibration import _outcomes, _profile
    from tests.planner.test_fit import shapes

    profile = _profile()
    path = tmp_path / bench_plan.result_name("profile", "2 colocated x1")
    dataclasses.replace(profile, serving=ServingCost(step_factor=9.0)).save(path)
    with pytest.raises(SystemExit, match="not kept beside"):
        bench_plan.refitted(path)
    save_samples([StepSample(s, profile.step.seconds(s)) for s in shapes()], path.with_suffix(".samples.json"))
    record = CalibrationRecord(2, *_outcomes(profile, 2, 0.015, 0.05))
    record.save(path.with_suffix(".calibration.json"))
    refit = Profile.load(bench_plan.refitted(path))
    assert refit.fit.max_abs_error < 0.01  # the kept steps, fitted again
    assert refit.serving == fitted(dataclasses.replace(refit, serving=ServingCost()), record).serving
    assert refit.serving.step_factor < 9.0


def test_a_run_around_which_the_machine_changed_pace_is_marked_and_summarised_apart(tmp_path):
    """The manifest keeps the machine's pace after each calibration and around each run (`machine_pace`); a row
    whose last run saw it move past PACE_TOLERANCE is unsteady, and the summary also covers the steady rows."""
    from scripts.machine_pace import Pace

    assert Pace(12.0, 9.0).drift(Pace(10.0, 10.0)) == pytest.approx(0.2)  # the larger change, signed
    assert Pace(10.0, 7.0).drift(Pace(10.0, 10.0)) == pytest.approx(-0.3)
    reference = {"decode_ms": 10.0, "prefill_ms": 20.0}
    steady, slow = {"before": reference, "after": reference}, {"before": reference, "after": {"decode_ms": 13.0,
                                                                                             "prefill_ms": 20.0}}
    manifest = {"measured": "2026-11-27 15:00", "commit": "abc", "scale": 0.5, "chosen_default": "",
                "layouts": {"mine": []}, "seeds": {"burst": 1, "long-outputs": 2},
                "pace": {"mine": {"reference": reference, "runs": {"burst": [slow, {**slow, "seed": 1001}], "long-outputs": [steady]}}}}
    (tmp_path / bench_plan.MANIFEST).write_text(json.dumps(manifest))
    for workload in ("burst", "long-outputs"):
        (tmp_path / bench_plan.result_name("real", "mine", workload)).write_text(json.dumps(_result(100.0)))
    _, rows = bench_plan.read_pass(tmp_path)
    assert [(r["workload"], r["pace"], r["steady"], r["seed"]) for r in rows] == [  # again: on prompts of its own
        ("burst", "+0% / +30% (measured again)", False, 1001), ("long-outputs", "+0% / +0%", True, 2)]
    manifest["pace"]["mine"]["runs"]["burst"][1].pop("seed")  # measured again on its own prompts: left out
    (tmp_path / bench_plan.MANIFEST).write_text(json.dumps(manifest))
    assert [r["workload"] for r in bench_plan.read_pass(tmp_path)[1]] == ["long-outputs"]
    rows[0]["pred"], rows[1]["pred"] = _result(200.0), _result(105.0)  # the unsteady run 100% off, the steady 5%
    assert "**unsteady**" in bench_plan.table(rows)
    text = bench_plan.summary(rows)
    assert "| TTFT p50 | 52% | 100% |" in text and "The 1 of 2 runs" in text and "| TTFT p50 | 5% | 5% |" in text


def test_the_machine_pace_is_measured_on_the_threads_asked_for():
    import torch

    from scripts.machine_pace import machine_pace

    threads = torch.get_num_threads()
    pace = machine_pace(1)
    assert pace.decode_ms > 0 and pace.prefill_ms > 0 and torch.get_num_threads() == threads  # put back


def test_a_paced_profile_scales_memory_bound_terms_by_the_decode_piece_and_compute_bound_by_the_prefill_one(tmp_path):
    """The model on the machine as it ran: a run 20% slower on the decode-like piece and 10% on the prefill-like
    one (the mean of before and after) prices a decode row 1.2x and a prompt token 1.1x; serving's costs stay."""
    from costmodel import Profile, StepCost
    from machine_pace import Pace
    from tests.cluster.test_serving_calibration import _profile

    profile = _profile()
    path = tmp_path / "profile.json"
    profile.save(path)
    attempt = {"before": {"decode_ms": 11.0, "prefill_ms": 10.0}, "after": {"decode_ms": 13.0, "prefill_ms": 12.0}}
    paced = Profile.load(bench_plan.paced_profile(path, attempt, Pace(10.0, 10.0), tmp_path / "paced.json"))
    assert paced.step.fixed_s == pytest.approx(profile.step.fixed_s * 1.2)
    assert paced.step.per_token_s == pytest.approx(profile.step.per_token_s * 1.1)
    assert paced.serving == profile.serving
    assert set(StepCost().to_dict()) == set(bench_plan.DECODE_TERMS) | set(bench_plan.PREFILL_TERMS)
