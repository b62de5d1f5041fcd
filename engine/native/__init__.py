"""Native (C++) CPU kernels: built on first use, optional (the PyTorch path is the fallback)."""

from engine.native.loader import load_cpu_kernels

__all__ = ["load_cpu_kernels"]
