"""dtype "auto" follows what the CPU computes in hardware; the CPU's signature names its extensions."""

from __future__ import annotations

import pytest
import torch

from engine.config import auto_dtype, parse_dtype
from engine.cpu_features import CPUFeatures, capped, cpu_features

AVX2_ONLY = CPUFeatures("AMD EPYC", frozenset({"avx2", "fma"}))
AVX512_BF16 = CPUFeatures("AMD EPYC", frozenset({"avx2", "fma", "avx512f", "avx512_bf16"}))
AMX = CPUFeatures("Intel Xeon", frozenset({"avx2", "fma", "avx512f", "amx_tile", "amx_bf16"}))


def test_auto_is_bfloat16_only_where_the_cpu_computes_it_natively():
    assert auto_dtype("cpu", AVX2_ONLY) == torch.float32  # emulated bf16 is several times slower
    assert auto_dtype("cpu", AVX512_BF16) == torch.bfloat16
    assert auto_dtype("cpu", AMX) == torch.bfloat16
    assert auto_dtype("cuda", AVX2_ONLY) == torch.bfloat16


def test_auto_on_this_machine_follows_its_flags_and_explicit_names_win():
    expected = torch.bfloat16 if cpu_features().native_bf16 else torch.float32
    assert parse_dtype("auto") == parse_dtype(None) == expected
    assert parse_dtype("float32") == torch.float32 and parse_dtype("bf16") == torch.bfloat16


def test_features_are_read_from_cpuinfo(tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nmodel name\t: Test CPU 9000\nflags\t\t: fpu avx2 fma avx512_bf16\n")
    features = cpu_features.__wrapped__(str(cpuinfo))
    assert features.native_bf16 and features.signature() == "Test CPU 9000 [avx2 fma avx512_bf16]"
    missing = cpu_features.__wrapped__(str(tmp_path / "absent"))
    assert missing == CPUFeatures("unknown CPU", frozenset()) and not missing.native_bf16


def test_the_cpu_signature_names_the_model_and_its_vector_extensions():
    signature = cpu_features().signature()
    assert "[" in signature and signature.endswith("]")
    if "avx512f" in open("/proc/cpuinfo").read():
        assert "avx512f" in signature


def test_a_cap_hides_the_extensions_above_it_and_dtype_auto_follows():
    to_avx2 = capped(AMX, "avx2")
    assert to_avx2.flags == frozenset({"avx2", "fma"}) and to_avx2.hidden == AMX.flags - {"avx2", "fma"}
    assert auto_dtype("cpu", to_avx2) == torch.float32 and auto_dtype("cpu", capped(AMX, "native")) == torch.bfloat16
    to_avx512 = capped(AVX512_BF16, "AVX512")
    assert to_avx512.flags == frozenset({"avx2", "fma", "avx512f"}) and not to_avx512.native_bf16
    assert to_avx512.signature() == "AMD EPYC [avx2 fma avx512f] (hidden: avx512_bf16)"
    assert capped(AVX2_ONLY, "avx2") == AVX2_ONLY  # nothing to hide: the same features, no "hidden" note


def test_an_unknown_cap_is_refused_by_name():
    with pytest.raises(ValueError, match="TANDEM_CPU_MAX_ISA='sse9'.*avx2, avx512, native"):
        capped(AMX, "sse9")
