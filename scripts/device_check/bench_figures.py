"""Key figures from what the steps wrote: the kernel tests' counts, the kernels' share of the peak, the
engine against transformers."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ElementTree
from pathlib import Path


def test_figures(junit_xml: Path) -> dict[str, str]:
    """pytest's counts; a run that tested nothing, or skipped a case, is an error (ValueError)."""
    suite = ElementTree.parse(junit_xml).getroot()
    suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
    counts = {key: int(suite.get(key, 0)) for key in ("tests", "failures", "errors", "skipped")}
    if counts["tests"] == 0 or counts["skipped"]:
        raise ValueError(f"the kernel cases did not all run: {counts}")
    passed = counts["tests"] - counts["failures"] - counts["errors"]
    return {"cases": f"{passed} of {counts['tests']} passed in {float(suite.get('time', 0)):.0f} s"}


def kernel_figures(path: Path) -> dict[str, str]:
    """Per case, the Triton kernel's (on CPU: the reference's) bandwidth as a share of the peak; TFLOP/s."""
    raw = json.loads(path.read_text())
    peak = raw["peak_bytes_s"]
    impl = "triton" if any(r["impl"] == "triton" for r in raw["rows"]) else "reference"
    figures = {"peak": f"{peak / 1e9:.0f} GB/s ({raw['peak_source']})"}
    for row in (r for r in raw["rows"] if r["impl"] == impl):
        bandwidth = row["bytes"] / row["seconds"]
        text = f"{impl} {row['seconds'] * 1e6:.0f} us, {bandwidth / 1e9:.1f} GB/s = {bandwidth / peak:.0%} of peak"
        if row["flops"]:
            text += f", {row['flops'] / row['seconds'] / 1e12:.1f} TFLOP/s"
        figures[row["case"]] = text
    return figures


def engine_figures(path: Path) -> dict[str, str]:
    """Per workload, Tandem's and transformers' output tokens/s and their ratio; the greedy agreement."""
    raw = json.loads(path.read_text())
    by = {(r["engine"], r["workload"]): r for r in raw["results"]}
    figures = {}
    for workload in sorted({w for _, w in by}):
        ours, hf = by.get(("tandem", workload)), by.get(("transformers", workload))
        text = f"tandem {ours['tok_s']:.0f} tok/s" if ours else "tandem: no result"
        if ours and hf:
            text += f", transformers {hf['tok_s']:.0f} tok/s: {ours['tok_s'] / hf['tok_s']:.2f}x"
        figures[f"workload {workload}"] = text
    a, b = by.get(("tandem", "a")), by.get(("transformers", "a"))
    if a and b:
        ours, ref = a["extra"]["first_output_token_ids"], b["extra"]["first_output_token_ids"]
        same = next((i for i, (x, y) in enumerate(zip(ours, ref)) if x != y), min(len(ours), len(ref)))
        figures["greedy agreement (a)"] = f"first {same}/{len(ref)} tokens as transformers"
    return figures
