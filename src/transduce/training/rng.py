"""The random states a checkpoint keeps, so that a resumed run draws what it would have drawn.

They are kept as tensors and plain data (the safe checkpoint format, ``transduce.checkpoint``):
torch's and CUDA's as their ByteTensors, Python's as ``[version, [625 ints], gauss]`` and NumPy's
as ``[name, [624 ints], pos, has_gauss, cached_gaussian]``, the fields of ``random.getstate()``
and ``numpy.random.get_state()`` with tuples and arrays as lists; restoring gives back exactly
those states. (``set_rng_state`` also takes the tuples and arrays themselves.)
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch


def _python_state() -> list[Any]:
    version, internal, gauss = random.getstate()
    return [version, list(internal), gauss]


def _numpy_state() -> list[Any]:
    name, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)
    assert isinstance(keys, np.ndarray)  # the legacy state: (name, keys, ...), never a dict
    return [name, keys.tolist(), int(pos), int(has_gauss), float(cached)]


def rng_state(device: torch.device) -> dict[str, Any]:
    """This process's random states: the CPU's, Python's, NumPy's and, when it trains on a GPU,
    that GPU's alone (a resume may see fewer GPUs, or number them differently)."""
    state = {"torch": torch.get_rng_state(), "python": _python_state(), "numpy": _numpy_state()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def seed_all(seed: int) -> None:
    """Seed this process's torch (CPU and GPUs), Python and NumPy generators."""
    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed % 2**32)


def _set_python(state: Sequence[Any]) -> None:
    version, internal, gauss = state
    random.setstate((int(version), tuple(int(x) for x in internal), gauss))


def _set_numpy(state: Sequence[Any]) -> None:
    name, keys, pos, has_gauss, cached = state
    np.random.set_state(
        (str(name), np.asarray(keys, dtype=np.uint32), int(pos), int(has_gauss), float(cached))
    )


def set_rng_state(state: dict[str, Any], device: torch.device) -> None:
    """Restore the states of ``rng_state``."""
    torch.set_rng_state(state["torch"])
    _set_python(state["python"])
    _set_numpy(state["numpy"])
    cuda = state.get("cuda")
    if isinstance(cuda, list):  # checkpoints before 2026-11-24 kept every visible GPU's state
        index = device.index or 0
        cuda = cuda[index] if index < len(cuda) else None
    if cuda is not None and device.type == "cuda":
        torch.cuda.set_rng_state(cuda, device)


__all__ = ["rng_state", "seed_all", "set_rng_state"]
