"""What this CPU is: its feature flags, read once (the int8 and native-kernel rules read them)."""

from __future__ import annotations

import functools
from pathlib import Path


@functools.lru_cache(maxsize=1)
def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags of /proc/cpuinfo (empty where there is none: not Linux)."""
    try:
        for line in Path("/proc/cpuinfo").read_text(errors="replace").splitlines():
            if line.startswith("flags"):
                return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


__all__ = ["cpu_flags"]
