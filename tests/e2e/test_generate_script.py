"""The main job until the router lands: scripts/generate.py, run as a user runs it."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_generate_script_prints_a_completion(tiny_model_dirs):
    cmd = [
        sys.executable,
        str(ROOT / "scripts" / "generate.py"),
        "--model",
        tiny_model_dirs["qwen3"],
        "--max-tokens",
        "5",
        "--no-chat",
        "The quick brown fox",
        "Paris is",
    ]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.count(">>> ") == 2
    assert "[5 tokens, length]" in result.stdout
    assert "KV cache:" in result.stderr and "blocks of 16 tokens" in result.stderr


def test_generate_script_reports_a_missing_model_clearly(tmp_path):
    missing = tmp_path / "no_such_model"
    cmd = [sys.executable, str(ROOT / "scripts" / "generate.py"), "--model", str(missing), "hi"]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert result.returncode != 0
    assert "does not exist" in result.stderr and str(missing) in result.stderr
