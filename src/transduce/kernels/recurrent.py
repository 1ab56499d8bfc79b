"""The LSTM's CPU rule. Under CPU autocast PyTorch hands a bfloat16 LSTM to oneDNN, whose
bfloat16 LSTM needs AVX-512: on an AMD Zen 3 (AVX2) it fails to build ("could not create a
primitive descriptor for the LSTM forward propagation primitive"). There the LSTM runs in float32
outside autocast; an LSTM whose weights are bfloat16 themselves (``precision: bf16-weights``)
takes PyTorch's own kernel and runs everywhere. Under float16 autocast on a CPU oneDNN has no
LSTM at all (the same error at the first step): ``fp16_lstm_runs``."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn
from torch.nn.utils.rnn import PackedSequence

__all__ = ["bf16_lstm_runs", "fp16_lstm_runs", "lstm"]


def bf16_lstm_runs(device: torch.device) -> bool:
    """Whether an LSTM under bfloat16 autocast runs on ``device``: off the CPU, or on a CPU with
    AVX-512 (oneDNN's bfloat16 LSTM)."""
    return device.type != "cpu" or torch.backends.cpu.get_cpu_capability().startswith("AVX512")


def fp16_lstm_runs(device: torch.device) -> bool:
    """Whether an LSTM under float16 autocast runs on ``device``: off the CPU only (oneDNN's
    CPU LSTM has no float16 primitive: a RuntimeError at the first step)."""
    return device.type != "cpu"


def lstm(
    module: nn.LSTM, x: Tensor | PackedSequence, state: tuple[Tensor, Tensor] | None = None
) -> tuple[Any, tuple[Tensor, Tensor]]:
    """``module(x, state)`` (x (N, T, E) or packed), in float32 outside autocast where bfloat16
    autocast would hand it to a oneDNN that cannot run it (``bf16_lstm_runs``)."""
    device = (x.data if isinstance(x, PackedSequence) else x).device
    if (
        device.type == "cpu"
        and torch.is_autocast_enabled("cpu")
        and torch.get_autocast_dtype("cpu") == torch.bfloat16
        and not bf16_lstm_runs(device)
    ):
        with torch.autocast("cpu", enabled=False):
            if state is not None:
                state = (state[0].float(), state[1].float())
            return module(x.float(), state)
    return module(x, state)
