"""scripts/bench_report.record_run: a run replaces its script's latest result in BENCHMARKS.md, plus a history file."""

from __future__ import annotations

import datetime

import pytest

from scripts.bench_report import markers, record_run

BENCHMARKS = """# Benchmarks

## Engine (`scripts/bench_engine.py`)

What it measures.

<!-- bench_engine:latest -->
### Engine throughput, 2026-01-01 00:00

| engine | tok/s |
|---|---|
| tandem | 1.0 |
<!-- /bench_engine:latest -->

## Router (`scripts/bench_router.py`)

<!-- bench_router:latest -->
router table
<!-- /bench_router:latest -->
"""


def engine_record(tok_s: float, when: str) -> str:
    """A record as bench_engine.py writes it: its own `## ` heading, a table."""
    table = f"| engine | tok/s |\n|---|---|\n| tandem | {tok_s} |\n"
    return f"## Engine throughput, {when}\n\n- Command: `python scripts/bench_engine.py`\n\n{table}"


def test_two_runs_leave_one_section_with_the_second_result_and_two_history_files(tmp_path):
    path = tmp_path / "BENCHMARKS.md"
    path.write_text(BENCHMARKS)
    first = datetime.datetime(2026, 2, 1, 10, 0)
    h1 = record_run(path, "bench_engine.py", engine_record(111.1, "2026-02-01 10:00"), now=first)
    h2 = record_run(path, "bench_engine.py", engine_record(222.2, "2026-02-01 10:00"), now=first)  # same minute

    text = path.read_text()
    begin, end = markers("bench_engine.py")
    assert text.count(begin) == text.count(end) == 1
    assert text.count("## Engine (`scripts/bench_engine.py`)") == 1
    latest = text[text.index(begin) : text.index(end)]
    assert "| tandem | 222.2 |" in latest
    assert "111.1" not in text and "| tandem | 1.0 |" not in text  # the older results live in history only
    assert "### Engine throughput, 2026-02-01 10:00" in latest  # the record's `##` sits under the script's `##`
    assert f"[`benchmarks/history/{h2.name}`]" in latest

    history = sorted((tmp_path / "benchmarks" / "history").iterdir())
    assert history == sorted([h1, h2]) and h1 != h2
    assert [h.name for h in history] == ["2026-02-01-1000-bench_engine-2.md", "2026-02-01-1000-bench_engine.md"]
    assert "| tandem | 111.1 |" in h1.read_text() and "| tandem | 222.2 |" in h2.read_text()
    assert h2.read_text().startswith("## Engine throughput")  # the full record, as the script wrote it

    # Every other section is untouched: the text around the engine's markers is as before.
    before = BENCHMARKS.split(begin)[0], BENCHMARKS.split(end)[1]
    assert text.startswith(before[0]) and text.endswith(before[1])


def test_a_script_without_markers_gets_a_section_of_its_own_at_the_end(tmp_path):
    path = tmp_path / "BENCHMARKS.md"
    path.write_text(BENCHMARKS)
    record_run(path, "bench_tp.py", "## Tensor parallel\n\nfirst\n", now=datetime.datetime(2026, 2, 1, 10, 0))
    record_run(path, "bench_tp.py", "## Tensor parallel\n\nsecond\n", now=datetime.datetime(2026, 2, 1, 11, 0))
    text = path.read_text()
    assert text.startswith(BENCHMARKS.rstrip("\n"))
    assert text.count("<!-- bench_tp:latest -->") == 1 and "second" in text and "first" not in text
    assert len(list((tmp_path / "benchmarks" / "history").glob("*-bench_tp.md"))) == 2


def test_headings_inside_code_blocks_are_left_alone(tmp_path):
    path = tmp_path / "B.md"
    record = "## Sweeps\n\n```\n# a shell comment\n```\n\n### mixed\n"
    record_run(path, "bench_cluster.py", record, now=datetime.datetime(2026, 2, 1))
    text = path.read_text()
    assert "### Sweeps" in text and "#### mixed" in text and "\n# a shell comment\n" in text


def test_unbalanced_markers_are_refused_rather_than_guessed(tmp_path):
    path = tmp_path / "BENCHMARKS.md"
    path.write_text(BENCHMARKS.replace("<!-- /bench_router:latest -->\n", ""))
    with pytest.raises(ValueError, match="unbalanced"):
        record_run(path, "bench_router.py", "x\n", now=datetime.datetime(2026, 2, 1))
    assert not (tmp_path / "benchmarks").exists()  # no history file for a run that was not recorded
    assert path.read_text() == BENCHMARKS.replace("<!-- /bench_router:latest -->\n", "")


def test_a_run_playing_an_older_cpu_keeps_its_own_section_and_says_so(tmp_path, monkeypatch):
    from engine.cpu_features import CPUFeatures, capped
    from scripts import bench_report

    path = tmp_path / "BENCHMARKS.md"
    path.write_text(BENCHMARKS)
    avx512 = CPUFeatures("AMD EPYC", frozenset({"avx2", "fma", "avx512f", "avx512_bf16"}))
    monkeypatch.setenv("TANDEM_CPU_MAX_ISA", "avx2")
    monkeypatch.setattr(bench_report, "cpu_features", lambda: capped(avx512, "avx2"))
    history = record_run(path, "bench_engine.py", engine_record(5.5, "2026-02-01 10:00"),
                         now=datetime.datetime(2026, 2, 1, 10, 0))  # fmt: skip

    text = path.read_text()
    assert text.startswith(BENCHMARKS)  # the machine's own result is untouched
    assert "## `scripts/bench_engine.py`, playing an older CPU (`TANDEM_CPU_MAX_ISA=avx2`)" in text
    begin, end = markers("bench_engine.py")
    assert begin == "<!-- bench_engine-avx2:latest -->" and "| tandem | 5.5 |" in text[text.index(begin) : text.index(end)]
    assert history.name == "2026-02-01-1000-bench_engine-avx2.md"
    monkeypatch.delenv("MKL_ENABLE_INSTRUCTIONS", raising=False)
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "avx2")
    assert bench_report.instruction_set() == ("AVX2, capped by TANDEM_CPU_MAX_ISA on a CPU with AVX-512 (BF16); "
                                              "PyTorch's own caps: ATEN_CPU_CAPABILITY=avx2; vLLM on the kernels it "
                                              "loads there (cluster_bench.peer_isa)")  # fmt: skip
