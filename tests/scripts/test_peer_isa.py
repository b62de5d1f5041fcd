"""scripts/cluster_bench/peer_isa: a peer interpreter started with its env sees the CPU that TANDEM_CPU_MAX_ISA plays."""

import os
import subprocess
import sys

import torch

from scripts.cluster_bench.peer_isa import LEVEL_VARIABLE, SITE_DIR, peer_isa_env

ASK = "import torch.cpu as c; print(c._is_avx512_supported(), c._is_avx512_bf16_supported())"


def _peer_answers(env: dict[str, str]) -> str:
    """What torch.cpu answers in a fresh interpreter (this venv's: it has torch, as vLLM's has)."""
    return subprocess.run([sys.executable, "-c", ASK], env=env, capture_output=True, text=True, check=True,
                          timeout=120).stdout.strip()  # fmt: skip


def test_the_native_level_leaves_the_peer_environment_alone(monkeypatch):
    monkeypatch.delenv("TANDEM_CPU_MAX_ISA", raising=False)
    env = {"PATH": "/usr/bin", "PYTHONPATH": "/somewhere"}
    assert peer_isa_env(env) == env


def test_a_played_avx2_cpu_hides_avx512_from_the_peer(monkeypatch):
    monkeypatch.setenv("TANDEM_CPU_MAX_ISA", "avx2")
    env = peer_isa_env({**os.environ, "PYTHONPATH": "/the/tandem/tree"})
    assert env["PYTHONPATH"] == str(SITE_DIR) and env[LEVEL_VARIABLE] == "avx2"
    assert _peer_answers(env) == "False False"


def test_a_played_avx512_cpu_keeps_avx512_and_hides_bf16(monkeypatch):
    monkeypatch.setenv("TANDEM_CPU_MAX_ISA", "avx512")
    has_avx512 = torch.cpu._is_avx512_supported()
    assert _peer_answers(peer_isa_env(dict(os.environ))) == f"{has_avx512} False"


def test_without_the_level_the_hook_changes_nothing():
    env = {**os.environ, "PYTHONPATH": str(SITE_DIR)}
    env.pop(LEVEL_VARIABLE, None)
    real = f"{torch.cpu._is_avx512_supported()} {torch.cpu._is_avx512_bf16_supported()}"
    assert _peer_answers(env) == real
