"""Every kernel case of this folder on the device and in the dtypes that the GPU check asks for.

scripts/gpu_check.py runs this module compiled on CUDA (TANDEM_KERNEL_DEVICE=cuda, bfloat16 and
float16, TRITON_INTERPRET=0) and, in its dry run, on CPU under the interpreter in float32 only (the
interpreter's tl.dot is wrong for 16-bit floats). Without TANDEM_KERNEL_DEVICE it is skipped: the
other modules here already check float32 on CPU. Attention is compared with the float32 reference
on the same rounded inputs (`paged_inputs.TOLERANCE`); the cache write must be bit-exact.
"""

import os

import pytest
import torch

from tests.engine.kernels.test_cache_write import SHAPES, check_cache_write
from tests.engine.kernels.test_decode_attention import CASES as DECODE_CASES
from tests.engine.kernels.test_decode_attention import check_decode
from tests.engine.kernels.test_prefill_attention import CASES as PREFILL_CASES
from tests.engine.kernels.test_prefill_attention import check_prefill

DEVICE = os.environ.get("TANDEM_KERNEL_DEVICE")
DTYPES = [getattr(torch, name) for name in os.environ.get("TANDEM_KERNEL_DTYPES", "float32").split(",")]

pytestmark = pytest.mark.skipif(
    DEVICE is None, reason="the GPU check's kernel step: scripts/gpu_check.py sets TANDEM_KERNEL_DEVICE"
)
by_dtype = pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).removeprefix("torch."))


@by_dtype
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_cache_write(shape, dtype):
    check_cache_write(*shape, dtype, DEVICE)


@by_dtype
@pytest.mark.parametrize("case", DECODE_CASES, ids=str)
def test_decode(case, dtype):
    check_decode(*case, dtype=dtype, device=DEVICE)


@by_dtype
@pytest.mark.parametrize("case", PREFILL_CASES, ids=str)
def test_prefill(case, dtype):
    check_prefill(*case, dtype=dtype, device=DEVICE)
