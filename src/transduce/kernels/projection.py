"""A projection x W^T + b laid out for decoding: each row count on the layout and library that
multiplied it fastest (the inference engine's ``DecodingModel`` keeps one per weight; see
benchmarks/RESULTS.md). ``ProjectionLayout.choose`` picks the library and the one-row split for a
model's weights once.

- our own kernel on W packed once into panels of 32 outputs (``native.f32_linear``) on Intel
  CPUs with AVX-512, for every row count but one row where the columns are split;
- MKL's ``addmm`` on W^T (in, out) stored contiguous, which MKL multiplies faster than
  nn.Linear's (out, in) at most decoding shapes;
- oneDNN's inner product on W in oneDNN's own blocked layout (``kernels.matmul.onednn_packed``) on
  x86 CPUs not made by Intel, where MKL's sgemm runs without its AVX-512 kernels;
- for one row, W^T's columns in P blocks multiplied by one ``bmm`` (``split_columns``), so P
  threads share the product: MKL's and oneDNN's one-row products run on one thread, bound by how
  fast one core reads W;
- for int8 decoding (``ProjectionLayout.int8``), W quantised per output channel, x per row, and
  every row count through int8 kernels that give the same numbers (``Int8Projection``;
  ``kernels.quantized``): a row's result is the same whatever the other rows (no float32 path
  for one row, which would part a sentence decoded alone from the same sentence in a batch).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from transduce.kernels import native
from transduce.kernels.matmul import (
    ONE_ROW_MKL_MAX_ELEMENTS,
    onednn_linear,
    onednn_packed,
    use_native_f32,
    use_onednn,
)
from transduce.kernels.options import Matmul
from transduce.kernels.quantized import (
    ONEDNN_MIN_ROWS,
    AmxInt8,
    OnednnInt8,
    amx_int8_available,
    amx_linear_rows,
    fbgemm_linear_rows,
    fbgemm_packed,
    onednn_int8_available,
    onednn_linear_rows,
    quantize_weight,
)


def one_row_is_read_bound(weight: Tensor) -> bool:
    """Whether a one-row product against weights like ``weight`` (float32 on the CPU) is bound by
    one core reading W and by operator calls rather than by arithmetic: MKL's and oneDNN's
    one-row products run on one thread. There splitting W's columns over threads
    (``ProjectionLayout.choose``) and fewer, smaller products a step (the engine's fold of
    encoder-decoder attention) pay (benchmarks/RESULTS.md)."""
    return weight.device.type == "cpu" and weight.dtype == torch.float32


@dataclass(frozen=True)
class ProjectionLayout:
    """How a model's ``Projection``s multiply, chosen once for its weights (``choose``): through
    our own kernel on W's panels (``native``), oneDNN's inner product on W in its own blocked
    layout (``onednn``) or MKL's ``addmm`` on W^T, and for one row W^T's columns in
    ``one_row_parts`` blocks, a block a thread (1: no split); with ``int8``, W quantised to
    int8 for every row count (``Int8Projection``; the other fields are then unused)."""

    onednn: bool = False
    one_row_parts: int = 1
    int8: bool = False
    native: bool = False

    def __post_init__(self) -> None:
        if self.one_row_parts < 1:
            raise ValueError(f"one_row_parts must be at least 1, not {self.one_row_parts}")
        if self.native and self.onednn:
            raise ValueError("a layout multiplies through our kernel or oneDNN's, not both")

    @classmethod
    def choose(
        cls,
        weight: Tensor,
        matmul: Matmul = "auto",
        one_row_parts: int | None = None,
        *,
        int8: bool = False,
    ) -> ProjectionLayout:
        """The layout for a model whose weights are like ``weight`` (device, dtype): our own
        kernel where ``use_native_f32(matmul, weight)`` says so (Intel CPUs with AVX-512 for
        "auto"), oneDNN where ``use_onednn(matmul, weight)`` does (x86 CPUs not made by Intel),
        else MKL; ``one_row_parts`` None = ``torch.get_num_threads()`` where
        ``one_row_is_read_bound(weight)``, else 1. The thread count is read now: a later change
        keeps the split. ``int8``: the int8 layout, with the float32 one for small weights' one
        row (float32 weights on the CPU only, a ValueError otherwise)."""
        if int8 and (weight.device.type != "cpu" or weight.dtype != torch.float32):
            raise ValueError(
                f"int8 projections quantise float32 CPU weights, not {weight.dtype} on "
                f"{weight.device}"
            )
        if one_row_parts is None:
            one_row_parts = torch.get_num_threads() if one_row_is_read_bound(weight) else 1
        native = use_native_f32(matmul, weight)  # (unused under int8)
        return cls(not native and use_onednn(matmul, weight), one_row_parts, int8, native)


def transposed(weight: Tensor, block: int = 256) -> Tensor:
    """(out, in) -> a contiguous (in, out) copy, written ``block`` rows at a time: about twice as
    fast as ``weight.t().contiguous()`` on the CPU, whose strided copy misses the cache."""
    out = weight.new_empty(weight.size(1), weight.size(0))  # (in, out)
    for i in range(0, weight.size(0), block):
        out[:, i : i + block].copy_(weight[i : i + block].t())
    return out


def split_columns(weight: Tensor, bias: Tensor | None, parts: int) -> tuple[Tensor, Tensor | None]:
    """W (out, in), b (out,) -> W^T's columns in ``parts`` blocks (P, in, C) and b's (P, 1, C),
    C = ceil(out / P), the last block padded with zero columns: ``bmm`` of a row against them
    runs the blocks on P threads, where a one-row ``addmm`` runs on one."""
    out_f, in_f = weight.shape
    cols = -(-out_f // parts)  # C
    padded = weight.new_zeros(parts * cols, in_f)  # (P*C, in)
    padded[:out_f] = weight
    blocks = transposed(padded).view(in_f, parts, cols).transpose(0, 1)  # (in, P, C) -> (P, in, C)
    if bias is None:
        return blocks.contiguous(), None
    padded_bias = bias.new_zeros(parts * cols)
    padded_bias[:out_f] = bias
    return blocks.contiguous(), padded_bias.view(parts, 1, cols)  # (P*C,) -> (P, 1, C)


# ``Projection.many_rows``' libraries (batch_step.cpp's ``Kind``)
MANY_ROWS_PANELS, MANY_ROWS_ONEDNN, MANY_ROWS_MKL = 0, 1, 2


@dataclass(frozen=True)
class Projection:
    """x (N, in) -> x W^T + b (N, out), each row count on the layout and library that multiplied
    it fastest (benchmarks/RESULTS.md): our own kernel on W's panels (``panels``), MKL's addmm on
    W^T (in, out) stored contiguous (``weight_t``), oneDNN's inner product on W (out, in)
    (``weight``, see ``kernels.matmul``), and for one row a batched product over W^T's columns in
    P blocks (``blocks``), a block a thread. ``relu`` is max(0, x W^T + b), in the same call on
    the panels. Made by ``of``."""

    out_features: int
    bias: Tensor | None
    weight_t: Tensor | None  # W^T (in, out); None when other layouts take every row count
    weight: Tensor | None  # W (out, in) for oneDNN, in its layout (onednn_packed); None = MKL only
    blocks: Tensor | None  # (P, in, C) from split_columns, for one row; None = no split
    blocks_bias: Tensor | None  # (P, 1, C)
    panels: Tensor | None = None  # native.f32_pack(W) (ceil(out / 32), in, 32); None = not ours

    @classmethod
    def of(
        cls,
        weight: Tensor,
        bias: Tensor | None,
        layout: ProjectionLayout = ProjectionLayout(),
        *,
        one_row: bool = True,
    ) -> Projection:
        """A copy of W (out, in) and b (out,) for MKL, or for oneDNN with ``layout.onednn``; with
        ``layout.one_row_parts`` P > 1, one row multiplies P column blocks at once
        (``split_columns``). ``one_row=False``: no layout kept for one row alone (a projection
        that takes many rows; one row then goes through the layout of many). With
        ``layout.int8``, an ``Int8Projection`` of W quantised, for every row count."""
        if layout.int8:
            return Int8Projection.quantized(weight, bias)
        bias = None if bias is None else bias.clone()
        parts = layout.one_row_parts
        split = parts > 1 and one_row
        blocks, blocks_bias = split_columns(weight, bias, parts) if split else (None, None)
        if layout.native:
            return cls(
                weight.size(0), bias, None, None, blocks, blocks_bias, native.f32_pack(weight)
            )
        if layout.onednn:
            # one row against a small weight is faster on MKL (unless split)
            one_row_mkl = one_row and not split and weight.numel() <= ONE_ROW_MKL_MAX_ELEMENTS
            weight_t = transposed(weight) if one_row_mkl else None
            plain = onednn_packed(weight)
        else:
            weight_t, plain = transposed(weight), None
        return cls(weight.size(0), bias, weight_t, plain, blocks, blocks_bias)

    def __call__(self, x: Tensor) -> Tensor:
        rows, blocks, weight_t = x.size(0), self.blocks, self.weight_t
        if rows == 1 and blocks is not None:
            return self._one_row(x, blocks)
        if self.panels is not None:
            return native.f32_linear(x, self.panels, self.bias, self.out_features)
        if self.weight is not None and (weight_t is None or rows > 1):
            return onednn_linear(x, self.weight, self.bias)
        assert weight_t is not None  # of (no oneDNN weight) or (one row, small weight)
        if self.bias is None:
            return x @ weight_t
        return torch.addmm(self.bias, x, weight_t)

    def many_rows(self) -> tuple[Tensor, int] | None:
        """The weight and library that ``__call__`` multiplies many rows with, for native code
        that calls the same product (``native.decoder_batch_step``): W's panels and
        ``MANY_ROWS_PANELS``, oneDNN's W and ``MANY_ROWS_ONEDNN``, or MKL's W^T and
        ``MANY_ROWS_MKL``; None for int8 (``Int8Projection``) or without a weight."""
        if type(self) is not Projection:
            return None
        if self.panels is not None:
            return self.panels, MANY_ROWS_PANELS
        if self.weight is not None:
            return self.weight, MANY_ROWS_ONEDNN
        return None if self.weight_t is None else (self.weight_t, MANY_ROWS_MKL)

    def relu(self, x: Tensor) -> Tensor:
        """max(0, x W^T + b): x (N, in) -> (N, out), the ReLU in the product's own call on the
        panels."""
        if self.panels is not None and (x.size(0) > 1 or self.blocks is None):
            return native.f32_linear(x, self.panels, self.bias, self.out_features, relu=True)
        return self(x).relu_()

    def _one_row(self, x: Tensor, blocks: Tensor) -> Tensor:
        """x (1, in) -> (1, out) through the column ``blocks`` (P, in, C)."""
        xs = x.expand(blocks.size(0), 1, x.size(1))  # (1, in) -> (P, 1, in), a view
        if self.blocks_bias is None:
            y = torch.bmm(xs, blocks)  # (P, 1, C)
        else:
            y = torch.baddbmm(self.blocks_bias, xs, blocks)  # (P, 1, C)
        y = y.view(1, -1)  # (P, 1, C) -> (1, P*C): W's rows in order, then the padding
        return y if y.size(1) == self.out_features else y[:, : self.out_features]


@dataclass(frozen=True)
class Int8Projection(Projection):
    """x (N, in) -> x W^T + b (N, out) with W quantised to int8 per output channel and x per row
    on every call: where our AMX kernel runs (``kernels.quantized.amx_int8_available``), through
    it at every row count (``amx``, then W's only copy); elsewhere through fbgemm
    (``kernels.quantized.fbgemm_linear_rows``), and from ``ONEDNN_MIN_ROWS`` rows through
    oneDNN's AMX kernel where it runs (``onednn``; not None where ``onednn_int8_available``).
    All give the same numbers bit for bit, so a row's result is independent of the other rows
    and of their number. ``bias`` is b as given (float32, added after the product); ``packed``
    holds W's int8 copy with its scales for fbgemm. Made by ``quantized`` (or ``Projection.of``
    with an int8 layout)."""

    packed: Any = None
    onednn: OnednnInt8 | None = None
    amx: AmxInt8 | None = None

    @classmethod
    def quantized(cls, weight: Tensor, bias: Tensor | None) -> Int8Projection:
        """W (out, in), in >= 2, and b (out,), float, quantised and packed."""
        if weight.size(1) < 2:
            raise ValueError(f"int8 projections need 2 or more inputs, not {weight.size(1)}")
        bias = None if bias is None else bias.detach().float().clone()
        q = quantize_weight(weight)
        if amx_int8_available():  # every row count: no other copy
            return cls(weight.size(0), bias, None, None, None, None, amx=AmxInt8.of(q))
        onednn = OnednnInt8.of(q) if onednn_int8_available() else None
        packed = fbgemm_packed(q, None)
        return cls(weight.size(0), bias, None, None, None, None, packed=packed, onednn=onednn)

    def __call__(self, x: Tensor) -> Tensor:
        if self.amx is not None:
            return amx_linear_rows(x, self.amx, self.bias)
        if self.onednn is not None and x.size(0) >= ONEDNN_MIN_ROWS:
            return onednn_linear_rows(x, self.onednn, self.bias)
        return fbgemm_linear_rows(x, self.packed, self.bias)


__all__ = [
    "Int8Projection",
    "Projection",
    "ProjectionLayout",
    "one_row_is_read_bound",
    "split_columns",
    "transposed",
]
