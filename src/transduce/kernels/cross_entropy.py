"""Pieces of the training loss (``training/loss.py``) that depend on the device: a softmax
computed in place where the kernel allows it, the native CPU kernel of the smoothed loss and its
gradient (``native_takes``, ``native_smoothed_rows``), and Liger-Kernel's cross-entropy on CUDA
GPUs (the ``gpu`` extra, ``pip install transduce[gpu]``), imported lazily; absent,
``liger_available`` says no and the training loss computes it itself."""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
from torch import Tensor

from transduce.kernels import native


def softmax_(x: Tensor) -> Tensor:
    """softmax(x) over the last dim of a float32 x (n, V), written into x on the CPU (its kernel
    reads each element of a row before writing it there: in place is exact, and no second
    (n, V) tensor is made), into a new tensor elsewhere."""
    if x.device.type == "cpu":
        return torch.ops.aten._softmax.out(x, -1, False, out=x)
    return torch.softmax(x, dim=-1)


def native_takes(logits: Tensor) -> bool:
    """Whether ``native_smoothed_rows`` computes the loss of ``logits``: float32 or bfloat16 on
    the CPU, the native kernels built."""
    return (
        logits.device.type == "cpu"
        and logits.dtype in (torch.float32, torch.bfloat16)
        and native.available()
    )


# logits (N, V), target (N,), keep (N,) -> (lse, z_y, z_sum), the gradient written into ``grad``
# (``native.smoothed_cross_entropy``): the loss's one pass over the logits on the CPU
native_smoothed_rows = native.smoothed_cross_entropy


@functools.lru_cache(maxsize=1)
def _liger_cross_entropy() -> Callable[..., Tensor] | None:
    """Liger's functional cross-entropy, or None where it cannot be imported (not installed,
    no Triton)."""
    try:
        from liger_kernel.transformers.functional import liger_cross_entropy
    except Exception:  # ImportError, or a Triton that fails to load
        return None
    fn: Callable[..., Tensor] = liger_cross_entropy
    return fn


def liger_available(device: torch.device) -> bool:
    """Whether Liger's cross-entropy kernel can run on ``device``: a CUDA GPU, Liger installed."""
    return device.type == "cuda" and _liger_cross_entropy() is not None


def liger_smoothed_cross_entropy_sum(
    logits: Tensor, target: Tensor, *, epsilon: float, ignore_index: int
) -> Tensor:
    """The label-smoothed cross-entropy of logits (N, V) against target (N,), summed over the
    rows whose target is not ``ignore_index``, as a float32 () tensor; torch's definition of
    label smoothing (eps / V on every class). Liger's kernel writes the gradient into
    ``logits`` during the forward pass: they hold it afterwards."""
    fn = _liger_cross_entropy()
    if fn is None:
        raise RuntimeError("liger-kernel is not installed (pip install transduce[gpu])")
    loss = fn(logits, target, ignore_index=ignore_index, label_smoothing=epsilon, reduction="sum")
    return loss.float()


__all__ = [
    "liger_available",
    "liger_smoothed_cross_entropy_sum",
    "native_smoothed_rows",
    "native_takes",
    "softmax_",
]
