"""CPU kernels of our own in C++, compiled on first use with PyTorch's extension builder and
cached, for work PyTorch spreads over many operators or passes (benchmarks/RESULTS.md):

- ``rows.cpp``: per-row int8 quantisation (``int8_rows``, ``guarded_rows``; kernels/quantized.py),
  about ten operators a product in PyTorch, 2-3x faster in one pass, bit for bit the numbers of
  the PyTorch form (tests/kernels/test_native.py);
- ``log_softmax_topk.cpp``: the k best log-probabilities of each row of a step's logits
  (``log_softmax_topk``; kernels/topk_tiles.py), without writing the (N, V) log-probabilities;
  its values differ from PyTorch's ``log_softmax`` in the last bits;
- ``training.cpp``: dropout's keep-and-scale tensor from a counter-based random stream
  (``dropout_keep_scale``; kernels/dropout.py) and the label-smoothed cross-entropy with its
  gradient written in place (``smoothed_cross_entropy``; training/loss.py), each one pass where
  PyTorch takes several operators and float32 copies, and the gradients' sum of squares
  (``sum_of_squares``; kernels/norm.py) in float64 at the memory's speed;
- ``layer_norm.cpp``: layer normalisation's forward and backward passes for training
  (``layer_norm``, ``layer_norm_backward``; kernels/norm.py), float32 or bfloat16, where
  PyTorch's bfloat16 kernels run several times slower than their memory traffic;
- ``decoder_row.cpp``: one decoding step of one hypothesis row through the whole decoder and the
  pre-softmax projection in one call (``decoder_row_step``; inference/engine/native_row.py),
  where PyTorch's ~20 operators a layer cost more than their products at batch 1, and a beam's
  reorder of those rows in their buffers (``reorder_row_buffers``; inference/engine/cache.py);
- ``amx_int8.cpp``: int8 products on AMX's tiles (``amx_int8_linear``; kernels/quantized.py),
  the rows quantised and the sums scaled in the same call, fbgemm's numbers bit for bit;
- ``f32_gemm.cpp``: float32 products on W packed once into panels (``f32_linear``;
  kernels/projection.py), the decoding engine's on Intel CPUs with AVX-512;
- ``adam.cpp``: Adam's step on float32 master weights from the bfloat16 working copy's
  gradients, writing the working copy too (``adam_bf16_copy``; kernels/adam.py), torch's fused
  Adam bit for bit in one pass where widening the gradients, Adam and the copy take three;
- ``batch_step.cpp``: a batch's decoding step on the lineage table, every layer and the
  pre-softmax projection in one call of the operators above and the float32 products' libraries
  (``decoder_batch_step``; inference/engine/batch_step.py), which saves the Python between them;
- ``beam_select.cpp``: beam search's choice of a step (``beam_select``; kernels/beam_select.py,
  inference/beam_choice.py): the best extensions, the finished, the done and the next step's rows in
  one pass where PyTorch takes ~30 operators on (sentences, beam) tensors;
- ``vec.h``: the vector helpers they share (16 float lanes, a vectorised exp); ``api.h``: the
  operators one source calls in another.

PyTorch's forms stay the fallback.

Building needs a C++ compiler and ninja (Debian: ``g++ ninja-build``); it takes ~10-30 s once,
into PyTorch's extension folder (``TORCH_EXTENSIONS_DIR``, default ~/.cache/torch_extensions),
under a name that changes with the source, PyTorch's version and the CPU's features (the code is
compiled for this CPU, ``-march=native``). Where it fails, one warning says why and PyTorch's
form computes. ``TRANSDUCE_NATIVE=0`` turns the kernels off; in CI, ``TRANSDUCE_NATIVE=require``
makes a failed build an error.
"""

from __future__ import annotations

import functools
import hashlib
import os
import sys
import warnings
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from transduce.kernels.cpu import cpu_flags

HERE = Path(__file__).resolve().parent
SOURCES = tuple(
    HERE / name
    for name in (
        "rows.cpp",
        "log_softmax_topk.cpp",
        "training.cpp",
        "layer_norm.cpp",
        "decoder_row.cpp",
        "amx_int8.cpp",
        "f32_gemm.cpp",
        "adam.cpp",
        "batch_step.cpp",
        "beam_select.cpp",
    )
)
HEADERS = (HERE / "vec.h", HERE / "api.h")  # included by the sources: part of the build's name
VARIABLE = "TRANSDUCE_NATIVE"
NAMESPACE = "transduce_native"  # the operators' namespace, TORCH_LIBRARY in rows.cpp
CFLAGS = ("-O3", "-march=native", "-fno-math-errno", "-fno-trapping-math", "-fopenmp")


class NativeBuildError(RuntimeError):
    """The native kernels could not be built or loaded (where ``TRANSDUCE_NATIVE=require``)."""


def build_name() -> str:
    """The extension's name: a digest of what its code depends on (the source, the flags,
    PyTorch's version, the CPU's features), so a change of any builds anew."""
    parts = [path.read_bytes() for path in SOURCES + HEADERS]
    parts += [" ".join(CFLAGS).encode(), torch.__version__.encode()]
    parts.append(" ".join(sorted(cpu_flags())).encode())
    digest = hashlib.sha256(b"\0".join(parts)).hexdigest()[:12]
    return f"transduce_native_{digest}"


@functools.lru_cache(maxsize=1)
def available() -> bool:
    """Whether the native operators are loaded (building them now if needed); False where
    ``TRANSDUCE_NATIVE=0``, off Linux x86, or where the build failed (with one warning)."""
    mode = os.environ.get(VARIABLE, "1")
    if mode == "0":
        return False
    try:
        _load()
    except Exception as e:  # no compiler, no ninja, a failed compile: PyTorch's form computes
        if mode == "require":
            raise NativeBuildError(f"transduce's native CPU kernels did not build: {e}") from e
        reason = _reason(e)
        warnings.warn(
            f"transduce's native CPU kernels did not build ({reason}); PyTorch's operators "
            f"compute the same numbers, more slowly (set {VARIABLE}=0 to skip the build)",
            RuntimeWarning,
            stacklevel=2,
        )
        return False
    return True


def _reason(e: Exception) -> str:
    """A failed build's cause in one line: the compiler's first error, else the last line."""
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    errors = [line for line in lines if "error" in line.lower()]
    return (errors or lines or [type(e).__name__])[0 if errors else -1][:300]


def _load() -> None:
    if not (sys.platform.startswith("linux") and cpu_flags()):
        raise NativeBuildError("built on Linux x86 only")
    from torch.utils import cpp_extension

    name = build_name()
    try:  # a private helper of PyTorch's, for the message only
        folder: Path | None = Path(cpp_extension._get_build_directory(name, verbose=False))
    except Exception:
        folder = None
    if folder is None or not (folder / f"{name}.so").exists():
        where = f" into {folder}" if folder is not None else ""
        print(
            f"transduce: compiling its native CPU kernels once (10-30 s){where}",
            file=sys.stderr,
            flush=True,
        )
    cpp_extension.load(
        name,
        [str(p) for p in SOURCES],
        extra_cflags=list(CFLAGS),
        is_python_module=False,
        verbose=False,
    )


def int8_rows(x: Tensor) -> tuple[Tensor, Tensor]:
    """x (N, in) float32 -> (k (N, in) int8, units (N, 1)): ``quantized.onednn_linear_rows``'s
    rows, k = nearbyint(x / unit + 128) - 128 (needs ``available()``)."""
    q, units = getattr(torch.ops, NAMESPACE).int8_rows(x)
    return q, units


def f32_gemm_available() -> bool:
    """Whether ``f32_linear`` runs: built for a CPU with AVX-512 (needs ``available()``)."""
    return bool(getattr(torch.ops, NAMESPACE).f32_gemm_available())


def f32_pack(weight: Tensor) -> Tensor:
    """W (out, in) float32 -> its panels (ceil(out / 32), in, 32) for ``f32_linear``, zeros past
    W's last row (needs ``available()``)."""
    packed: Tensor = getattr(torch.ops, NAMESPACE).f32_pack(weight)
    return packed


def f32_linear(
    x: Tensor, packed: Tensor, bias: Tensor | None, out_features: int, relu: bool = False
) -> Tensor:
    """x (N, in) float32 -> x W^T + b (N, out) float32, ReLU'd where ``relu``, W as
    ``f32_pack``'s panels; each output a sum over the inputs in order, so a row's result does
    not depend on the other rows (needs ``f32_gemm_available()``)."""
    empty = x.new_empty(0)
    y: Tensor = getattr(torch.ops, NAMESPACE).f32_linear(
        x, packed, empty if bias is None else bias, out_features, relu
    )
    return y


def amx_int8_available() -> bool:
    """Whether ``amx_int8_linear`` runs: built with AMX's int8 tiles and the process allowed to
    use them (needs ``available()``)."""
    return bool(getattr(torch.ops, NAMESPACE).amx_int8_available())


def amx_int8_pack(weight: Tensor) -> Tensor:
    """W (out, in) int8 -> its AMX tiles (ceil(out / 16), ceil(in / 64), 16, 64) int8 for
    ``amx_int8_linear`` (needs ``available()``)."""
    packed: Tensor = getattr(torch.ops, NAMESPACE).amx_int8_pack(weight)
    return packed


def amx_int8_linear(
    x: Tensor, packed: Tensor, scale: Tensor, bias: Tensor | None, out_features: int
) -> Tensor:
    """x (N, in) float32 -> (N, out) float32: each row quantised as ``int8_rows`` does, its int8
    products with W (``amx_int8_pack``) summed exactly on AMX's tiles, then ((float) sum *
    scale) * unit + bias, each step rounded: ``quantized.fbgemm_linear_rows``'s numbers, bit for
    bit (needs ``amx_int8_available()``)."""
    empty = scale.new_empty(0)
    out: Tensor = getattr(torch.ops, NAMESPACE).amx_int8_linear(
        x, packed, scale, empty if bias is None else bias, out_features
    )
    return out


def guarded_rows(x: Tensor) -> tuple[Tensor, Tensor]:
    """x (N, in) float32 -> (rows (1 + N, in), units (N, 1)): the guard row then x / unit,
    ``quantized.fbgemm_linear_rows``'s input (needs ``available()``)."""
    rows, units = getattr(torch.ops, NAMESPACE).guarded_rows(x)
    return rows, units


def log_softmax_topk(
    logits: Tensor, k: int, lo: int, hi: int, force: Tensor | None = None, forced: int = -1
) -> tuple[Tensor, Tensor]:
    """logits (N, V) float32 -> (values (N, k) float32, indices (N, k) int64): the k largest of
    each row of log_softmax(logits), columns lo..hi never chosen, best first, ties to the first
    index; 1 <= k <= the columns that may be chosen (needs ``available()``). Rows where
    ``force`` (N,) bool is True: column ``forced``'s log-probability first, then -inf (at the
    first columns that may be chosen)."""
    empty = logits.new_empty(0, dtype=torch.bool)
    values, indices = getattr(torch.ops, NAMESPACE).log_softmax_topk(
        logits, k, lo, hi, empty if force is None else force, forced
    )
    return values, indices


def beam_select(
    row_top: Tensor,
    row_tok: Tensor,
    scores: Tensor,
    n_finished: Tensor,
    finished_scores: Tensor,
    lp_max_len: Tensor,
    max_lens: Tensor,
    numbers: tuple[int, float, float, int, int, bool],
) -> tuple[Any, ...]:
    """Beam search's choice of a step (``kernels.beam_select``, which names the tensors):
    ``numbers`` are (step, lp_now, lp_next, nbest, eos, in_place) -> (top, parent, tok, ended,
    normalised, finished_scores, n_finished, keep, rows, next_tok, next_scores, any_ended),
    eleven tensors and a bool (needs ``available()``)."""
    out: tuple[Any, ...] = getattr(torch.ops, NAMESPACE).beam_select(
        row_top, row_tok, scores, n_finished, finished_scores, lp_max_len, max_lens, *numbers
    )
    return out


def dropout_keep_scale(like: Tensor, scale: Tensor, threshold: int, seed: int) -> Tensor:
    """(shape of like) in like's dtype (2 or 4 bytes an element): ``scale`` (0-dim, like's
    dtype) where kept, 0 where dropped; element i kept where its 16-bit draw (SplitMix64's
    words of ``seed``, four draws a word) is >= ``threshold`` (0 .. 2^16; needs
    ``available()``)."""
    out: Tensor = getattr(torch.ops, NAMESPACE).dropout_keep_scale(like, scale, threshold, seed)
    return out


def sum_of_squares(xs: list[Tensor]) -> Tensor:
    """sum over the contiguous float32 or bfloat16 CPU tensors xs of sum_i x_i^2, a 0-dim
    float64 tensor, the same for any number of threads (needs ``available()``)."""
    out: Tensor = getattr(torch.ops, NAMESPACE).sum_of_squares(xs)
    return out


def adam_bf16_copy(
    params: list[Tensor],
    grads: list[Tensor],
    exp_avgs: list[Tensor],
    exp_avg_sqs: list[Tensor],
    steps: list[Tensor],
    working: list[Tensor],
    *,
    lr: float,
    betas: tuple[float, float],
    eps: float,
    weight_decay: float,
    grad_scale: float,
    vector_width: int,
) -> None:
    """One Adam step (torch's fused, decoupled weight decay) of the float32 ``params`` from the
    bfloat16 ``grads`` times ``grad_scale``, in place: ``exp_avgs``, ``exp_avg_sqs`` (float32),
    ``steps`` (one-element float32, incremented first) and ``working`` (bfloat16, the updated
    params rounded); every tensor contiguous on the CPU, each list's j-th as long as params[j];
    the last ``numel % vector_width`` elements of each as torch's scalar loop makes them (needs
    ``available()``)."""
    getattr(torch.ops, NAMESPACE).adam_bf16_copy(
        params, grads, exp_avgs, exp_avg_sqs, steps, working,
        lr, betas[0], betas[1], eps, weight_decay, grad_scale, vector_width,
    )  # fmt: skip


def smoothed_cross_entropy(
    logits: Tensor,
    target: Tensor,
    keep: Tensor,
    eps: float,
    grad_scale: float,
    grad: Tensor | None,
) -> tuple[Tensor, Tensor, Tensor]:
    """logits (N, V) float32 or bfloat16; target (N,) int64, every entry a column; keep (N,)
    bool -> (log sum_v exp z, z at the target, sum_v z), each (N,) float32, in one pass over the
    logits. With ``grad`` (N, V), contiguous and in the logits' dtype (it may be ``logits``),
    (softmax(z) - q) * grad_scale is written into it, q the smoothed target, rows where not
    ``keep`` 0 (needs ``available()``)."""
    lse, z_y, z_sum = getattr(torch.ops, NAMESPACE).smoothed_cross_entropy(
        logits.contiguous(), target.contiguous(), keep.contiguous(), eps, grad_scale, grad
    )
    return lse, z_y, z_sum


def layer_norm(x: Tensor, weight: Tensor, bias: Tensor, eps: float) -> tuple[Tensor, ...]:
    """x (rows, d) contiguous, weight and bias (d,), all float32 or all bfloat16 -> (y (rows, d)
    in x's dtype, mean (rows,), rstd (rows,) float32) (needs ``available()``)."""
    y, mean, rstd = getattr(torch.ops, NAMESPACE).layer_norm(x, weight, bias, eps)
    return y, mean, rstd


def layer_norm_backward(
    grad: Tensor, x: Tensor, mean: Tensor, rstd: Tensor, weight: Tensor
) -> tuple[Tensor, ...]:
    """The gradients (dx, dweight, dbias) of ``layer_norm`` given grad (rows, d) of y and the
    forward pass's x, mean, rstd, weight (needs ``available()``)."""
    dx, dw, db = getattr(torch.ops, NAMESPACE).layer_norm_backward(grad, x, mean, rstd, weight)
    return dx, dw, db


def reorder_row_buffers(buffers: list[Tensor], index: Tensor, t: int) -> int:
    """In place: row i of each buffer (rows, capacity, H, size), each row's positions one block,
    takes positions 0 .. t-1 of row index[i] (index (N,) int64 of rows 0 .. N-1, repeats
    allowed; every source read before any row is written, every buffer checked before any is)
    -> the number of rows that moved (needs ``available()``)."""
    return int(getattr(torch.ops, NAMESPACE).reorder_row_buffers(buffers, index, t))


def decoder_row_step(
    x: Tensor,
    weights: Tensor,
    int8_weights: Tensor,
    row_sums: Tensor,
    dims: tuple[int, ...],
    buffers: list[Tensor],
    t: int,
    cross: list[Tensor],
    folded: bool,
    eps: float,
) -> Tensor:
    """One decoding step of one row: x (1, D) float32, the step's input -> logits (1, V).
    ``weights``: inference/engine/native_row.py's packing for ``dims`` (L, D, H, K, Dv, F, V,
    activation, pre_norm), with ``int8_weights`` (int8) and ``row_sums`` (int32) for int8
    products, both empty for float32 ones; ``buffers``: 2 a layer, (1, capacity > t, H, K) and
    (1, capacity, H, Dv), position ``t`` written; ``cross``: 3 a layer, the fold's (A, c, M)
    where ``folded``, else (keys (1, H, S, K), values (1, H, S, Dv), an additive mask (S,) or
    an empty tensor); ``eps`` the layer norms' (needs ``available()``)."""
    out: Tensor = getattr(torch.ops, NAMESPACE).decoder_row_step(
        x, weights, int8_weights, row_sums, list(dims), buffers, t, cross, folded, eps
    )
    return out


def decode_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None) -> Tensor:
    """softmax(q k^T / sqrt(K) + mask) v for a search step's few queries: q (B, H, T, K), k (B,
    H, S, K), v (B, H, S, Dv) float32, the last dimension contiguous (other strides any); mask
    bool (B, H, T, S), broadcast views welcome, True = may attend, or None -> (B, H, T, Dv),
    zeros where a query may attend nothing (needs ``available()``). Its memory is (B, T, H, Dv):
    ``out.transpose(1, 2).reshape(B * T, H * Dv)`` is a view."""
    empty = q.new_empty(0, dtype=torch.bool)
    out: Tensor = getattr(torch.ops, NAMESPACE).decode_attention(
        q, k, v, empty if mask is None else mask
    )
    return out


def decoder_batch_step(
    x: Tensor,
    weights: list[Tensor],
    biases: list[Tensor],
    kinds: list[int],
    outs: list[int],
    norms: list[Tensor],
    kv: list[Tensor],
    lineage: Tensor,
    t: int,
    cross: list[Tensor],
    mask: Tensor,
    dims: list[int],
    eps: float,
) -> Tensor:
    """A batch's decoder step on the lineage table in one call (``batch_step.cpp``; the engine's
    ``inference/engine/batch_step.py`` says what each argument holds) -> logits (N, V)."""
    logits: Tensor = getattr(torch.ops, NAMESPACE).decoder_batch_step(
        x, weights, biases, kinds, outs, norms, kv, lineage, t, cross, mask, dims, eps
    )
    return logits


def cached_self_attention(
    q: Tensor,
    k_new: Tensor,
    v_new: Tensor,
    k_buffer: Tensor,
    v_buffer: Tensor,
    lineage: Tensor,
    t: int,
) -> Tensor:
    """A search step's self-attention on a cache whose hypothesis rows are never gathered: the
    step's keys k_new (N, H, 1, K) and values v_new (N, H, 1, Dv) written at position ``t`` of
    rows 0..N-1 of k_buffer (R, capacity, H, K) and v_buffer (R, capacity, H, Dv), then q (N, H,
    1, K) over each hypothesis' t + 1 positions -> (N, H, 1, Dv). lineage (N, L) int64, L > t:
    position p < t of hypothesis i lies in buffer row lineage[i, p]; lineage[i, t] is set to i
    here. float32, buffers contiguous, last dimensions contiguous (needs ``available()``)."""
    out: Tensor = getattr(torch.ops, NAMESPACE).cached_self_attention(
        q, k_new, v_new, k_buffer, v_buffer, lineage, t
    )
    return out


__all__ = [
    "NAMESPACE",
    "adam_bf16_copy",
    "amx_int8_available",
    "amx_int8_linear",
    "amx_int8_pack",
    "cached_self_attention",
    "decode_attention",
    "decoder_batch_step",
    "decoder_row_step",
    "NativeBuildError",
    "available",
    "build_name",
    "dropout_keep_scale",
    "f32_gemm_available",
    "f32_linear",
    "f32_pack",
    "guarded_rows",
    "int8_rows",
    "layer_norm",
    "layer_norm_backward",
    "log_softmax_topk",
    "smoothed_cross_entropy",
    "sum_of_squares",
]
