"""Training precision: which autocast dtype a run uses on its device (``train.precision``)."""

from __future__ import annotations

from contextlib import AbstractContextManager

import torch

from transduce import kernels
from transduce.device import resolve_device
from transduce.errors import UserError

# Autocast dtype of each train.precision (fp32: autocast off; bf16-weights: off too, the model's
# working copy is bfloat16 itself, training/working_weights.py). The master weights, the
# optimizer state and the loss stay float32 in every case.
AUTOCAST_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def native_bf16(device: torch.device) -> bool:
    """Whether ``device`` computes in bfloat16 natively, so bf16 autocast speeds training up:
    a CUDA GPU of compute capability 8 (Ampere) or newer, a ROCm GPU, an x86 CPU with AVX512-BF16
    or AMX-BF16. Elsewhere bfloat16 is emulated through float32 conversions, slower than float32
    itself."""
    if device.type == "cuda":
        # not torch.cuda.is_bf16_supported(): by default it also says yes where bfloat16 is only
        # emulated (before Ampere), and it asks about the current device, not this one
        return bool(torch.version.hip) or torch.cuda.get_device_capability(device)[0] >= 8
    if device.type == "cpu":
        caps = torch.cpu.get_capabilities()
        return bool(caps.get("avx512_bf16") or caps.get("amx_bf16"))
    return False


def resolve_precision(precision: str, device: torch.device, processes: int = 1) -> str:
    """train.precision with ``auto`` made concrete for a new run on ``device`` with
    ``processes`` ranks: where ``native_bf16``, bf16-weights in one process (as accurate as
    autocast and faster: no casts around every layer norm and residual sum; benchmarks/
    RESULTS.md) and bf16 under torchrun (whose DDP overlaps the gradients' all-reduce with the
    backward pass; bf16-weights' one all-reduce an update does not, unmeasured against it);
    fp32 elsewhere. Any other value unchanged. A resumed run keeps what auto gave it
    (``auto_resolutions``)."""
    if precision != "auto":
        return precision
    if not native_bf16(device):
        return "fp32"
    return "bf16-weights" if processes == 1 else "bf16"


def auto_resolutions(device: torch.device) -> tuple[str, ...]:
    """Every precision that ``auto`` gives a run on ``device``, now or before 2026-11-28 (bf16
    in one process too): a run resumed with ``auto`` keeps the one it began with, so that its
    numerics do not change midway (training/run_folder.py)."""
    return ("bf16-weights", "bf16") if native_bf16(device) else ("fp32",)


def check_precision(precision: str, architecture: str, device: str | torch.device) -> None:
    """A UserError for a ``precision`` that ``architecture`` cannot train in on ``device`` (a
    user's string is resolved only when it matters): fp16 for the recurrent model (rnn) where
    its LSTM has no float16 kernel (``kernels.fp16_lstm_runs``: a CPU). The Transformer trains
    in fp16 on a CPU."""
    if precision != "fp16" or architecture != "rnn":
        return
    if not kernels.fp16_lstm_runs(resolve_device(device)):
        raise UserError(
            "precision fp16 with architecture: rnn on a CPU: the CPU's LSTM has no float16 "
            "kernel; use precision bf16 or fp32 there (fp16 on a CUDA GPU)"
        )


def autocast(precision: str, device: torch.device) -> AbstractContextManager[object]:
    """The autocast context of a concrete ``precision`` (fp32: a disabled one)."""
    dtype = AUTOCAST_DTYPES.get(precision)
    return torch.autocast(
        device_type=device.type, dtype=dtype or torch.bfloat16, enabled=dtype is not None
    )


def grad_scaler(precision: str, device: torch.device) -> torch.amp.GradScaler:
    """A loss scaler, enabled for fp16 only. float16 has 5 exponent bits: small gradients flush
    to 0 unless the loss is scaled up before backward. The scaler unscales the gradients, skips
    an update whose gradients hold inf/NaN and adapts the scale. bfloat16 has float32's range and
    needs none; disabled, the scaler is a no-op."""
    return torch.amp.GradScaler(device.type, enabled=precision == "fp16")


__all__ = [
    "AUTOCAST_DTYPES",
    "auto_resolutions",
    "autocast",
    "check_precision",
    "grad_scaler",
    "native_bf16",
    "resolve_precision",
]
