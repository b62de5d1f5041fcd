"""Triton kernels for the paged KV cache, each beside its PyTorch reference.

One file per kernel; each file has the Triton entry point and a `*_ref`
function of the same signature built on `engine.attention.torch_backend`.
Tests run the kernels on CPU under `TRITON_INTERPRET=1` (set before triton is
imported) and compare them with the references.

Importing this package does not import triton; the kernel modules do.
"""

# What the attention kernels can be specialised for. head_dim is a tl.arange
# extent (a power of two) and a tl.dot dimension (at least 16). The block
# size only sets how K/V positions map to cache slots (kernels address keys
# token by token); these are the sizes the tests cover.
SUPPORTED_HEAD_DIMS = (16, 32, 64, 128, 256)
SUPPORTED_BLOCK_SIZES = (16, 32, 64, 128)


def dot_precision(dtype) -> str:
    """tl.dot input precision: exact ("ieee") for float32 caches, else triton's default.

    Triton's default for float32 is TF32, which would make float32 models drift
    from the PyTorch path; 16-bit inputs are exact either way.
    """
    import torch

    return "ieee" if dtype == torch.float32 else "tf32"


def keys_per_tile(head_dim: int) -> int:
    """Keys per loop iteration (TILE_N): the pipelined K and V tiles fit in shared memory."""
    return 64 if head_dim <= 128 else 32


def check_layout(rows: tuple, caches: tuple, out=None) -> None:
    """The memory layout the kernels index by hand: rows with a contiguous last dim
    (strided views are fine), contiguous caches and output."""
    if any(t.stride(-1) != 1 for t in rows):
        raise ValueError("the kernels need query/key/value rows with a contiguous head_dim")
    if not all(c.is_contiguous() for c in caches):
        raise ValueError("the kernels need a contiguous KV cache")
    if out is not None and not out.is_contiguous():
        raise ValueError("the kernels need a contiguous output tensor")
