"""Run the Triton kernels on CPU through triton's interpreter.

triton.jit reads TRITON_INTERPRET when a kernel is decorated, i.e. when an
engine.kernels module is first imported; this conftest is loaded before the
test modules here import them. Nothing else in the suite uses triton, so the
variable staying set for the rest of the session changes no other test.
"""

import os

os.environ["TRITON_INTERPRET"] = "1"
