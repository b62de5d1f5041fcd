"""Run the Triton kernels on CPU through triton's interpreter, unless told otherwise.

triton.jit reads TRITON_INTERPRET when a kernel is decorated, i.e. when an
engine.kernels module is first imported; this conftest is loaded before the
test modules here import them. Nothing else in the suite uses triton, so the
variable staying set for the rest of the session changes no other test.
A value already set wins: scripts/gpu_check.py sets TRITON_INTERPRET=0 to run
test_kernels_on_device.py compiled on a GPU.
"""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")
