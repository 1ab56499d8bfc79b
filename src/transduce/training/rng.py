"""The random states a checkpoint keeps, so that a resumed run draws what it would have drawn."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch


def rng_state(device: torch.device) -> dict[str, Any]:
    """This process's random states: the CPU's, Python's, NumPy's and, when it trains on a GPU,
    that GPU's alone (a resume may see fewer GPUs, or number them differently)."""
    state = {
        "torch": torch.get_rng_state(), "python": random.getstate(),
        "numpy": np.random.get_state(),
    }  # fmt: skip
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def seed_all(seed: int) -> None:
    """Seed this process's torch (CPU and GPUs), Python and NumPy generators."""
    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed % 2**32)


def set_rng_state(state: dict[str, Any], device: torch.device) -> None:
    """Restore the states of ``rng_state``."""
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    cuda = state.get("cuda")
    if isinstance(cuda, list):  # checkpoints before 2026-11-24 kept every visible GPU's state
        index = device.index or 0
        cuda = cuda[index] if index < len(cuda) else None
    if cuda is not None and device.type == "cuda":
        torch.cuda.set_rng_state(cuda, device)


__all__ = ["rng_state", "seed_all", "set_rng_state"]
