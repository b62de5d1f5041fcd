"""Run at start-up by the peer's interpreter (vLLM's virtualenv) when `scripts/cluster_bench/peer_isa.py` puts this
directory on its PYTHONPATH: torch's questions about the CPU answer as the played CPU would, so vLLM loads
the kernel library it loads there (see peer_isa.py). Without TANDEM_PEER_MAX_ISA it does nothing."""

import os

# level -> torch.cpu's answers that go false at that level (what the level hides, as engine.cpu_features.ISA_CAPS)
_FALSE_AT = {
    "avx2": ("_is_avx512_supported", "_is_avx512_vnni_supported", "_is_avx512_bf16_supported",
             "_is_amx_tile_supported", "_is_amx_fp16_supported"),
    "avx512": ("_is_avx512_bf16_supported", "_is_amx_tile_supported", "_is_amx_fp16_supported"),
}  # fmt: skip


def _answer_as_played() -> None:
    names = _FALSE_AT.get(os.environ.get("TANDEM_PEER_MAX_ISA", ""), ())
    if not names:
        return
    import torch.cpu

    for name in names:
        if hasattr(torch.cpu, name):
            setattr(torch.cpu, name, lambda: False)


_answer_as_played()
