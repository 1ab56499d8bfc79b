"""int8 products for decoding on the CPU: x W^T + b with W stored as int8 with one float scale
per output channel (symmetric: W ~ W_q * scale[:, None], W_q in [-127, 127]) and x quantised per
row on every call (dynamic quantisation), the sums in int32, the result float32.

Three kernels, bit for bit the same numbers (tested), so that the row count may choose:
- fbgemm's dynamic quantized linear (``torch.ops.quantized.linear_dynamic`` on fbgemm-prepacked
  weights; ``fbgemm_linear_rows``), the fastest at every shape and row count of
  benchmarks/int8_kernels.py on AMD Zen 5 and, up to a few rows, on an Intel Xeon with AMX,
  where fbgemm runs its AVX512-VNNI kernels (it has no AMX ones);
- oneDNN's int8 inner product (``torch.ops.onednn.qlinear_pointwise``; ``onednn_linear_rows``),
  which runs AMX's int8 tiles: from ``ONEDNN_MIN_ROWS`` rows on a CPU with ``amx_int8``
  (``onednn_int8_available``), 1.1-2.5x fbgemm there (benchmarks/RESULTS.md). oneDNN takes the
  activations' scale when it builds its kernel, so x is scaled per row to a fixed grid first
  (scale 1) and one kernel serves every call;
- our own on AMX's int8 tiles (``native.amx_int8_linear``; ``amx_linear_rows``), which
  quantises the rows, sums and scales in one call: at every row count where it runs
  (``amx_int8_available``), 1.3-4x oneDNN's at the engine's shapes and 2-5x fbgemm's for 1-24
  rows (benchmarks/RESULTS.md), and then the only copy of the weights.

Both see each row divided by its unit max_j |x_ij| / 127 (``row_units``), so its entries lie in
[-127, 127] up to float rounding, rounded to the nearest integer (ties to even) after adding 128;
both sum the integer products exactly in int32, convert the sum to float32 and multiply it by
the weights' scales and then by the row's unit. A row holding NaN or infinity spoils fbgemm's
range for the whole batch (its other rows then differ from oneDNN's); a model's float32
activations hold neither. ``torch._weight_int8pack_mm`` (int8 weights, float activations) has no
fast CPU kernel.

int8 pays only with int8 dot-product instructions: AVX512-VNNI or AVX-VNNI (x86 CPUs since
Cascade Lake and Zen 4) or AMX (Intel Sapphire Rapids and later), read from /proc/cpuinfo by
``int8_supported``; without them an int8 product is emulated with 16-bit multiplies.
"""

from __future__ import annotations

import functools
import os
import warnings
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from transduce.kernels import native
from transduce.kernels.cpu import cpu_flags

# The CPU flags (of /proc/cpuinfo) that give int8 dot products: without one, an int8 product is
# emulated with 16-bit multiplies and is no faster than float32
INT8_DOT_FLAGS = ("avx512_vnni", "avx_vnni", "amx_int8")
FORCE_VARIABLE = "TRANSDUCE_FORCE_INT8"


def cpu_int8_flags() -> tuple[str, ...]:
    """Which of ``INT8_DOT_FLAGS`` this CPU has."""
    flags = cpu_flags()
    return tuple(f for f in INT8_DOT_FLAGS if f in flags)


def fbgemm_available() -> bool:
    """Whether this PyTorch has fbgemm's quantized operators (x86 builds do)."""
    return "fbgemm" in torch.backends.quantized.supported_engines


def int8_supported() -> bool:
    """Whether int8 decoding may run here: the CPU has int8 dot-product instructions, or
    ``TRANSDUCE_FORCE_INT8=1`` says to run it anyway (correct everywhere, slow without them)."""
    return bool(cpu_int8_flags()) or os.environ.get(FORCE_VARIABLE) == "1"


def int8_refusal(device: torch.device) -> str | None:
    """Why int8 decoding cannot run on ``device`` (one line), or None where it can."""
    if device.type != "cpu":
        return f"int8 decoding runs on CPUs; use fp32 or bf16 on {device.type}"
    if not fbgemm_available():
        return "int8 decoding needs PyTorch's fbgemm (x86 builds); this PyTorch lacks it"
    if not int8_supported():
        return (
            "int8 decoding needs int8 dot-product instructions (avx512_vnni, avx_vnni or "
            "amx_int8), which this CPU lacks (it would be slower than fp32); set "
            f"{FORCE_VARIABLE}=1 to run it anyway"
        )
    return None


@dataclass(frozen=True)
class QuantizedWeight:
    """W (out, in) as int8 ``weight`` (out, in) in [-127, 127] and float32 ``scale`` (out,):
    W ~ weight * scale[:, None], each row's largest magnitude mapped to 127."""

    weight: Tensor
    scale: Tensor

    def dequantized(self) -> Tensor:
        """(out, in) float32: what the int8 products multiply by."""
        return self.weight.float() * self.scale[:, None]


def quantize_weight(weight: Tensor) -> QuantizedWeight:
    """W (out, in) float -> per-output-channel symmetric int8 (a row of zeros: scale 1)."""
    w = weight.detach().float()
    top = w.abs().amax(dim=1)  # (out,)
    scale = torch.where(top > 0, top / 127, torch.ones_like(top))
    q = torch.round(w / scale[:, None]).clamp_(-127, 127).to(torch.int8)
    return QuantizedWeight(q.contiguous(), scale.contiguous())


def fbgemm_packed(q: QuantizedWeight, bias: Tensor | None) -> Any:
    """fbgemm's packed (W_q, scales, b) for ``fbgemm_linear`` (an opaque object)."""
    previous = torch.backends.quantized.engine
    with warnings.catch_warnings():  # PyTorch flags its quantized tensors as deprecated
        warnings.simplefilter("ignore")
        zero = torch.zeros(q.scale.numel(), dtype=torch.long)
        qw = torch._make_per_channel_quantized_tensor(q.weight, q.scale.double(), zero, 0)
        try:
            torch.backends.quantized.engine = "fbgemm"
            return torch.ops.quantized.linear_prepack(qw, None if bias is None else bias.float())
        finally:
            torch.backends.quantized.engine = previous


def fbgemm_linear(x: Tensor, packed: Any) -> Tensor:
    """x (N, in) float32 -> x W^T + b (N, out) float32, x quantised per tensor on the way (one
    scale and zero point from the whole batch's smallest and largest entries)."""
    return torch.ops.quantized.linear_dynamic(x, packed, _reduce_range())


# fbgemm's dynamic quantisation maps [min(x), max(x)] (0 included) onto 0..255; a first row
# holding -128 and 127 fixes that range, so scale 1 and zero point 128: each row, divided by its
# unit, is rounded to the integers k in [-128, 127], as CTranslate2 quantises a row
_GUARD_LOW, _GUARD_HIGH = -128.0, 127.0
_TINY = torch.finfo(torch.float32).tiny
# The row count from which oneDNN's int8 kernel multiplies where it runs AMX: below it fbgemm was
# faster (a fixed ~25 us a call), from 32 rows oneDNN at the engine's weights (RESULTS.md)
ONEDNN_MIN_ROWS = 32


@functools.cache
def _guard_row(width: int) -> Tensor:
    """(1, width): the guard row, made once per width (its values are never written)."""
    row = torch.full((1, width), _GUARD_HIGH)
    row[0, 0] = _GUARD_LOW
    return row


def row_units(x: Tensor) -> Tensor:
    """x (N, in) -> (N, 1): each row's quantisation step, max_j |x_ij| / 127, at least the
    smallest normal float: a row of zeros divides to zeros, and a row whose step would be
    subnormal divides to less than 127 (a subnormal step's rounding took x / step to 127.001,
    past the guard row's range, which changed every row's quantisation in fbgemm)."""
    return (x.abs().amax(dim=1, keepdim=True) / 127).clamp_(min=_TINY)


def _finish(y: Tensor, units: Tensor, bias: Tensor | None) -> Tensor:
    """y (N, out) of the int8 sums times the weights' scales -> y * units + bias, in place: a new
    (N, out) tensor costs more than the pass (640 x 8000: 3.8 ms against 3.2)."""
    return y.mul_(units) if bias is None else torch.addcmul(bias, y, units, out=y)


def fbgemm_linear_rows(x: Tensor, packed: Any, bias: Tensor | None) -> Tensor:
    """x (N, in) float32 -> x W^T + b (N, out) float32 with each row of x quantised on its own
    (``row_units``), so a row's quantisation does not depend on the other rows (the float32
    parts around it still differ in their last bits between batch shapes, which int8's
    rounding can turn into another word: README). ``packed`` without a bias
    (``fbgemm_packed(q, None)``): each row's unit multiplies the product before b is added.
    The range is fixed by a guard row (above); in is at least 2. Without int8 dot products
    (``_reduce_range``) fbgemm takes 7 bits: a grid half as fine."""
    rows, units = guarded_rows(x)  # (1 + N, in), (N, 1)
    y = fbgemm_linear(rows, packed)[1:]  # (N, out): the guard row's product dropped
    return _finish(y, units, bias)


def guarded_rows(x: Tensor) -> tuple[Tensor, Tensor]:
    """x (N, in) float32 -> (the guard row then x / unit (1 + N, in), units (N, 1)): fbgemm's
    input, in one pass by the native kernel where it is built (``kernels.native``), else by
    PyTorch's operators (``guarded_rows_torch``): the same numbers."""
    if x.dtype == torch.float32 and native.available():
        return native.guarded_rows(x)
    return guarded_rows_torch(x)


def guarded_rows_torch(x: Tensor) -> tuple[Tensor, Tensor]:
    """``guarded_rows`` in PyTorch's operators."""
    units = row_units(x)  # (N, 1)
    return torch.cat((_guard_row(x.size(1)), x / units)), units  # (1 + N, in)


@functools.lru_cache(maxsize=1)
def onednn_int8_available() -> bool:
    """Whether oneDNN's int8 kernel takes the many-row products: this PyTorch has oneDNN's
    quantized inner product and the CPU AMX's int8 tiles (measured there only: elsewhere fbgemm)."""
    return (
        "amx_int8" in cpu_flags()
        and torch.backends.mkldnn.is_available()
        and hasattr(torch.ops.onednn, "qlinear_pointwise")
    )


def amx_int8_available() -> bool:
    """Whether our AMX kernel takes the int8 products (``native.amx_int8_linear``, every row
    count): a CPU with AMX's int8 tiles, the native kernels built with them, the process allowed
    to use them."""
    return "amx_int8" in cpu_flags() and native.available() and _amx_permitted()


@functools.lru_cache(maxsize=1)
def _amx_permitted() -> bool:
    return native.amx_int8_available()


@dataclass(frozen=True)
class AmxInt8:
    """W's int8 copy in AMX's tiles (``packed``: ``native.amx_int8_pack``), its scales (out,)
    and its row count."""

    packed: Tensor
    scale: Tensor
    out_features: int

    @classmethod
    def of(cls, q: QuantizedWeight) -> AmxInt8:
        return cls(native.amx_int8_pack(q.weight), q.scale, q.weight.size(0))


def amx_linear_rows(x: Tensor, w: AmxInt8, bias: Tensor | None) -> Tensor:
    """``fbgemm_linear_rows`` on AMX's int8 tiles, bit for bit its numbers: each row quantised
    as ``int8_rows`` does, the products summed exactly in int32, then ((float) sum * scale) *
    unit + bias as ``_finish`` takes them, in one native call (``native.amx_int8_linear``)."""
    return native.amx_int8_linear(x, w.packed, w.scale, bias, w.out_features)


@dataclass(frozen=True)
class OnednnInt8:
    """W's int8 copy in oneDNN's layout (``packed``), its scales (out,) and zero points (out,)."""

    packed: Tensor
    scale: Tensor
    zeros: Tensor

    @classmethod
    def of(cls, q: QuantizedWeight) -> OnednnInt8:
        zeros = torch.zeros(q.scale.numel(), dtype=torch.long)
        return cls(torch.ops.onednn.qlinear_prepack(q.weight, None), q.scale, zeros)


def onednn_linear_rows(x: Tensor, w: OnednnInt8, bias: Tensor | None) -> Tensor:
    """``fbgemm_linear_rows`` through oneDNN's int8 inner product, bit for bit its numbers: x's
    rows as int8 k = round(x / unit + 128) - 128 (ties to even, as fbgemm rounds), zero point 0,
    the kernel's output scale 1, each row's unit and b applied after. Signed, not uint8 with
    zero point 128: oneDNN takes a zero point's term off in float32, after the int32 sum is
    converted, which differs from fbgemm's exact int32 once the sums pass 2^24."""
    xq, units = int8_rows(x)  # (N, in) k in [-127, 127], (N, 1)
    y = torch.ops.onednn.qlinear_pointwise(
        xq, 1.0, 0, w.packed, w.scale, w.zeros, None, 1.0, 0, torch.float32, "none", [None], ""
    )
    return _finish(y, units, bias)


def int8_rows(x: Tensor) -> tuple[Tensor, Tensor]:
    """x (N, in) float32 -> (k = round(x / unit + 128) - 128 (N, in) int8, units (N, 1)):
    oneDNN's input, in one pass by the native kernel where it is built (``kernels.native``),
    else by PyTorch's operators (``int8_rows_torch``): the same numbers."""
    if x.dtype == torch.float32 and native.available():
        return native.int8_rows(x)
    return int8_rows_torch(x)


def int8_rows_torch(x: Tensor) -> tuple[Tensor, Tensor]:
    """``int8_rows`` in PyTorch's operators."""
    units = row_units(x)  # (N, 1)
    return (x / units).add_(128).round_().sub_(128).to(torch.int8), units


def activations_in_7_bits() -> bool:
    """Whether the int8 products quantise their input rows to 7 bits here (a CPU without int8
    dot products, int8 forced), not 8: what another int8 kernel must do to give the same
    numbers."""
    return _reduce_range()


@functools.lru_cache(maxsize=1)
def _reduce_range() -> bool:
    """Whether x is quantised to 7 bits instead of 8: without VNNI or AMX fbgemm sums pairs of
    products in 16 bits, which 8-bit activations could overflow; with them it sums in 32 bits."""
    return not cpu_int8_flags()


__all__ = [
    "FORCE_VARIABLE",
    "INT8_DOT_FLAGS",
    "ONEDNN_MIN_ROWS",
    "AmxInt8",
    "amx_int8_available",
    "amx_linear_rows",
    "OnednnInt8",
    "QuantizedWeight",
    "cpu_flags",
    "cpu_int8_flags",
    "fbgemm_available",
    "fbgemm_linear",
    "fbgemm_linear_rows",
    "fbgemm_packed",
    "guarded_rows",
    "guarded_rows_torch",
    "int8_rows",
    "int8_rows_torch",
    "int8_refusal",
    "int8_supported",
    "onednn_int8_available",
    "onednn_linear_rows",
    "quantize_weight",
    "row_units",
]
