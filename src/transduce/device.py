"""The device a user names (``cpu``, ``cuda``, ``cuda:N``, ``mps``, ``xpu``), checked before any
work; other device types (``meta``, ``xla``, ...) are a UserError."""

from __future__ import annotations

import torch

from transduce.errors import UserError


def resolve_device(device: str | torch.device) -> torch.device:
    """``torch.device`` of a user's string, or a UserError saying what is wrong with it: an
    unknown name, CUDA or MPS missing, or a GPU index past this machine's last GPU."""
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise UserError(f"unknown device {device!r} ({e}); use cpu, cuda or cuda:N") from None
    if dev.type not in ("cpu", "cuda", "mps", "xpu"):
        raise UserError(f"device {device!r}: transduce runs on cpu, cuda, cuda:N, mps or xpu")
    if dev.type == "cpu" and dev.index:  # torch takes "cpu:1" and ignores the 1
        raise UserError(f"device {device!r}: the CPU takes no index; use cpu")
    if dev.type == "xpu" and not (hasattr(torch, "xpu") and torch.xpu.is_available()):
        raise UserError(f"device {device!r} requested but no XPU is available; use cpu")
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise UserError(f"device {device!r} requested but CUDA is not available; use cpu")
        count = torch.cuda.device_count()
        if dev.index is not None and dev.index >= count:
            raise UserError(
                f"device {device!r} requested but this machine has {count} GPU(s): "
                f"cuda:0 to cuda:{count - 1}"
            )
    if dev.type == "mps" and not torch.backends.mps.is_available():
        raise UserError(f"device {device!r} requested but MPS is not available; use cpu")
    return dev


__all__ = ["resolve_device"]
