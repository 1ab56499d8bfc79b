"""Process-level settings of the CPU matrix library, applied once at start-up (by the CLI).

oneDNN, which runs PyTorch's bfloat16 matrix products on the CPU, compiles a kernel for every new
matrix shape and keeps the last 1024 in a cache. Token-count batches have a new shape almost every
step (Multi30k: 116 distinct row counts, each with its own kernels for the projections forward and
backward, plus the attention products), far more than 1024 kernels, so with the default cache every
bfloat16 training step recompiled most of its kernels. ``enlarge_onednn_cache`` raises the
capacity; a run then compiles each shape once, in its first epoch. The CLI applies it with
``tune_malloc`` (the same switch turns both off).
"""

from __future__ import annotations

import os

# Kernels oneDNN keeps (its default: 1024): bfloat16 training on Multi30k's token batches ran
# fastest at this size, for about 200 MB more memory than the default (benchmarks/RESULTS.md)
ONEDNN_CACHE_CAPACITY = 65536
_ONEDNN_CACHE_VARIABLE = "ONEDNN_PRIMITIVE_CACHE_CAPACITY"


def enlarge_onednn_cache(capacity: int = ONEDNN_CACHE_CAPACITY) -> bool:
    """Let oneDNN keep ``capacity`` compiled kernels (``ONEDNN_PRIMITIVE_CACHE_CAPACITY``).

    oneDNN reads the variable once, when the process makes its first oneDNN kernel (the first
    bfloat16 matrix product on the CPU), so call this before that; later it changes nothing. A
    value the user set is kept. Returns whether the variable now holds ``capacity``; False also
    when disabled by ``TRANSDUCE_MALLOC_TUNING=0``.
    """
    if os.environ.get("TRANSDUCE_MALLOC_TUNING", "1") == "0":
        return False
    os.environ.setdefault(_ONEDNN_CACHE_VARIABLE, str(capacity))
    return os.environ[_ONEDNN_CACHE_VARIABLE] == str(capacity)
