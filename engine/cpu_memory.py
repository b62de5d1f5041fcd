"""Host memory that a CPU engine's steps do not fault in again and again.

Two costs measured on a 2-core EPYC VM (a minor page fault there costs several microseconds):

- **Activations.** glibc gives large freed blocks back to the kernel (munmap, heap trimming), so the next
  step's activations of the same size are faulted in again: 20k-57k minor faults per 2,048-token prefill
  step, 600-640 ms; with freed memory kept for reuse, none after the first step, 565-570 ms. (glibc's
  adaptive threshold makes this differ between processes: some fault next to nothing on their own.)
  `keep_freed_memory` tells glibc so (what vLLM gets from preloading tcmalloc).
- **The KV cache.** Left lazy (fresh zero pages, nothing resident until written), every step wrote its
  blocks into never-touched memory, because prefix caching hands out never-used blocks first: a
  2,048-token prefill step spent ~100 ms writing its KV (3 ms into pages already touched). Memory the
  process touches for the first time is slow on this VM (about 1 GB/s, huge pages or not: the host backs
  it then), so the cache is asked for huge pages (`huge_pages`: fewer faults and TLB misses) and faulted
  in whole at start-up (`fault_in`: ~4.5 s for 2 GiB here, once), as vLLM's zeroed cache is.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters
_MMAP_THRESHOLD_MAX = 32 << 20  # glibc's largest (64-bit): bigger blocks are always mapped on their own
_MADV_HUGEPAGE = 14
_PAGE = 4096
_NEVER_TRIM = 2**31 - 1  # mallopt takes a C int: the largest free heap top kept (2 GiB)


@functools.cache
def _libc():
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    except OSError:
        return None


def keep_freed_memory() -> bool:
    """Process-wide: freed blocks up to 32 MiB stay in the heap and the heap is never trimmed, so a step's
    activations reuse the pages of the last step's. glibc only; False elsewhere (nothing changed)."""
    libc = _libc()
    mallopt = getattr(libc, "mallopt", None)
    if mallopt is None:
        return False
    return bool(mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD_MAX)) and bool(mallopt(_M_TRIM_THRESHOLD, _NEVER_TRIM))


def huge_pages(address: int, nbytes: int) -> bool:
    """Ask for transparent huge pages over [address, address + nbytes) (where the kernel allows them in
    `madvise` mode, or always; a no-op where they are off). False if the call failed."""
    libc = _libc()
    madvise = getattr(libc, "madvise", None)
    if madvise is None:
        return False
    start = address & ~(_PAGE - 1)
    return madvise(ctypes.c_void_p(start), ctypes.c_size_t(nbytes + address - start), _MADV_HUGEPAGE) == 0


def fault_in(buffer) -> None:
    """Write every page of a numpy `buffer` (with zeros: it stays what calloc gave), so that none faults
    later."""
    buffer[::_PAGE] = 0
