"""The dtype a model decodes with ("weights": the CLI's ``--precision``), apart from training's
autocast ``train.precision``: "fp32", "bf16", "fp16" (CUDA GPUs only: ``kernels.fp16_refusal``)
or "int8", a Transformer on the CPU with its inference engine's projections in int8
(``DecodingModel``'s ``int8``) and everything else in float32."""

from __future__ import annotations

from typing import Literal

import torch

from transduce import kernels
from transduce.architectures import Seq2Seq
from transduce.errors import UserError
from transduce.model.transformer import Transformer

WeightPrecision = Literal["fp32", "bf16", "fp16", "int8"]
# int8: the projections of the engine in int8, made from float32 weights; the rest float32
WEIGHT_DTYPES: dict[str, torch.dtype] = {
    "fp32": torch.float32,
    "bf16": torch.bfloat16,
    "fp16": torch.float16,
    "int8": torch.float32,
}


def weight_dtype(weights: str) -> torch.dtype:
    """The dtype of the model's weights for ``weights`` ("fp32", "bf16", "fp16"; "int8":
    float32, the engine quantises its copies); another name is a UserError."""
    if weights not in WEIGHT_DTYPES:
        raise UserError(f"weights must be one of {', '.join(WEIGHT_DTYPES)}; got {weights!r}")
    return WEIGHT_DTYPES[weights]


def check_device(weights: str, device: torch.device) -> None:
    """A one-line UserError where ``weights`` cannot decode on ``device`` (before a model is
    read): int8 off a CPU with int8 dot products (``kernels.int8_refusal``), fp16 off a CUDA
    GPU (``kernels.fp16_refusal``)."""
    refusal = {"int8": kernels.int8_refusal, "fp16": kernels.fp16_refusal}.get(weights)
    if refusal is not None and (why := refusal(device)) is not None:
        raise UserError(f"precision {weights}: {why}")


def check_int8(model: Seq2Seq, name: str | None = None) -> None:
    """A one-line UserError where ``model`` cannot decode with int8 weights: not a Transformer
    (int8 lives in its inference engine; the error names the model file ``name`` if given),
    or not on a CPU (or a CPU without int8 dot-product instructions, unless forced:
    ``kernels.int8_refusal``)."""
    if not isinstance(model, Transformer):  # first: no CPU would make it one
        raise UserError(
            f"{f'{name}: ' if name else ''}precision int8 is for Transformer models (their "
            f"inference engine); this model is a {type(model).__name__}: use fp32 or bf16"
        )
    why = kernels.int8_refusal(next(model.parameters()).device)
    if why is not None:
        raise UserError(f"precision int8: {why}")


__all__ = ["WEIGHT_DTYPES", "WeightPrecision", "check_device", "check_int8", "weight_dtype"]
