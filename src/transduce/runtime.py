"""Process-level settings that make PyTorch on the CPU faster.

glibc's malloc serves large blocks with mmap and gives freed memory back to the system at once, so
every training step pays page faults on fresh memory for its activations (slower training steps,
by how much depends on the machine; benchmarks/RESULTS.md).
``tune_malloc`` keeps freed memory in the heap instead, which is what setting
``MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=... MALLOC_TOP_PAD_=...`` does. The CLI calls it at
start-up unless ``TRANSDUCE_MALLOC_TUNING=0`` or ``--no-malloc-tuning``.

The CPU matrix library's kernel cache is raised beside it (``transduce.kernels.process``;
the same switch turns both off).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys

_M_TRIM_THRESHOLD = -1
_M_TOP_PAD = -2
_M_MMAP_MAX = -4

_tuned = False


def tune_malloc(top_pad: int = 1 << 30) -> bool:
    """Keep freed memory in glibc's heap (no mmap for big blocks, no trimming). Returns whether
    the settings were applied (False off glibc/Linux or when disabled by the environment)."""
    global _tuned
    if _tuned:
        return True
    if os.environ.get("TRANSDUCE_MALLOC_TUNING", "1") == "0" or not sys.platform.startswith(
        "linux"
    ):
        return False
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # musl and other libcs have no mallopt
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    ok = mallopt(_M_MMAP_MAX, 0) == 1
    ok &= mallopt(_M_TRIM_THRESHOLD, 2**31 - 1) == 1
    ok &= mallopt(_M_TOP_PAD, min(top_pad, 2**31 - 1)) == 1
    _tuned = bool(ok)
    return _tuned
