"""Compile every engine.kernels kernel for an H100 (sm_90) down to a cubin, no GPU needed.

The interpreter checks what the kernels compute; only the compiler checks that
they compile (dot shapes, layouts, types). Triton's wheel ships ptxas, so the
whole pipeline runs on a CPU machine. Run as a script without TRITON_INTERPRET,
with the dtypes to try (default bf16 fp32); prints one line per kernel and
exits non-zero if any fails.
"""

import sys

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from engine.kernels import cache_write, decode_attention, prefill_attention

H100 = GPUTarget("cuda", 90, 32)
# Arguments that are not the dtype of the model (other pointers are, other scalars are i32).
FIXED_TYPES = {
    "block_tables_ptr": "*i64",
    "slot_mapping_ptr": "*i64",
    "seq_lens_ptr": "*i32",
    "query_start_loc_ptr": "*i32",
    "lse_ptr": "*fp32",
    "partial_ptr": "*fp32",
    "qk_scale": "fp32",
}
SHAPES = dict(NUM_HEADS=32, NUM_KV_HEADS=8, GROUP=4, GROUP_PAD=16, HEAD_DIM=128, BLOCK_SIZE=16, HEADS_PAD=8)


def kernels(dtype: str):
    precision = "ieee" if dtype == "fp32" else "tf32"
    tiles = dict(TILE_N=64, DOT_PRECISION=precision)
    yield "cache_write", cache_write._cache_write_kernel, {}, {}
    for split in (False, True):
        out = {"out_ptr": "*fp32"} if split else {}
        yield f"decode split={split}", decode_attention._decode_kernel, dict(tiles, SPLIT=split), out
    yield "reduce_splits", decode_attention._reduce_splits_kernel, dict(SPLITS_PAD=4), {}
    yield "prefill", prefill_attention._prefill_kernel, dict(tiles, TOKENS=16, GROUP_PAD=4), {}


def compile_one(fn, dtype: str, constants: dict, types: dict, options: dict | None = None):
    constexprs = {name: value for name, value in {**SHAPES, **constants}.items() if name in fn.arg_names}
    signature = {}
    for name in fn.arg_names:
        default = f"*{dtype}" if name.endswith("_ptr") else "i32"
        signature[name] = "constexpr" if name in constexprs else types.get(name, FIXED_TYPES.get(name, default))
    # As at a real launch with aligned tensors: triton marks pointers and ints that
    # are multiples of 16, which is what lets it vectorise and pipeline the loads.
    names = enumerate(fn.arg_names)
    aligned = {(i,): [["tt.divisibility", 16]] for i, name in names if _multiple_of_16(name, signature)}
    source = ASTSource(fn=fn, signature=signature, constexprs=constexprs, attrs=aligned)
    return triton.compile(source, target=H100, options=options)


def _multiple_of_16(name: str, signature: dict) -> bool:
    return signature[name].startswith("*") or name.endswith("_stride") or name == "tokens_per_split"


def main(dtypes: list[str]) -> int:
    failed = 0
    for dtype in dtypes:
        for name, fn, constants, types in kernels(dtype):
            try:
                compiled = compile_one(fn, dtype, constants, types)
                pipelined = compiled.asm["ttgir"].count("async_copy_global_to_local")
                print(f"{name} {dtype}: ok, {compiled.metadata.shared} bytes shared memory, {pipelined} async copies")
            except Exception as err:  # any compiler error is a failure to report
                failed += 1
                print(f"{name} {dtype}: FAILED {type(err).__name__}: ...{str(err)[-300:]}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:] or ["bf16", "fp32"]))
