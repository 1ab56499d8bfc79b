"""softmax(Q K^T / sqrt(d_k)) V on the fastest path for the device and dtype.

Two paths compute the same function (tests/kernels/test_attention.py): PyTorch's fused kernel
(``F.scaled_dot_product_attention``) and the explicit formula (``attention_weights`` then a
product). The fused kernel is the default; training on the CPU with short keys takes the formula,
which is faster there: PyTorch's CPU flash-attention pays per (batch x head) block, and batches of
many short sentences have thousands of them. On the CPU the fused kernel runs in float32 for
bfloat16/float16 inputs too, its low-precision backward being several times slower, and a
low-precision softmax runs in float32 (benchmarks/RESULTS.md). A search's step on the CPU (a
few queries a row, float32, no gradients) takes a native kernel of ours where it is built
(``kernels.native.decode_attention``): (row, head) pairs on the threads, one pass over their
keys, where both PyTorch paths pay more per block than a step's work.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import Tensor

from transduce.kernels import native
from transduce.kernels.options import AttentionPath

_LOW_PRECISION = (torch.bfloat16, torch.float16)

# Training on the CPU with keys at most this long takes the formula ("auto"); about where the two
# paths were even in float32 on 2 cores (benchmarks/attention_paths.py)
FORMULA_MAX_KEYS_CPU_TRAINING = 128
# The most queries a row that the native kernel takes ("auto", decoding on the CPU): a search
# step's (one a hypothesis, or the hypotheses of a sentence grouped)
NATIVE_MAX_QUERIES = 8


def _fp32_on_cpu(x: Tensor) -> bool:
    """Whether attention on ``x`` runs in float32 although ``x`` is low precision."""
    return x.device.type == "cpu" and x.dtype in _LOW_PRECISION


def attention_input(x: Tensor, path: AttentionPath = "auto") -> Tensor:
    """A projection's output as the fused kernel will take it: float32 on the CPU for a
    low-precision ``x`` when no gradient is recorded (decoding), else ``x``. Casting the
    projection once before splitting heads costs less than one cast per head tensor."""
    if path != "formula" and _fp32_on_cpu(x) and not torch.is_grad_enabled():
        return x.float()
    return x


def _every_row_attends(mask: Tensor) -> bool:
    """Whether every query row of ``mask`` may attend to at least one key, so that softmax makes
    no NaN row. Asked only when training on the CPU, where skipping the zeroing pays and the check
    costs no device synchronisation; elsewhere False, and the rows are zeroed anyway."""
    return (
        mask.device.type == "cpu"
        and torch.is_grad_enabled()
        and not torch.compiler.is_compiling()  # a data-dependent branch breaks the graph
        and bool(mask.any(dim=-1).all())
    )


def attention_weights(query: Tensor, key: Tensor, mask: Tensor | None = None) -> Tensor:
    """softmax(Q K^T / sqrt(d_k)) as an explicit formula.

    query (B, H, T, K), key (B, H, T', K), mask bool broadcastable to (B, H, T, T') with True =
    may attend. Returns (B, H, T, T') in the dtype of ``query``. A query row whose keys are all
    masked gets all-zero weights (not NaN), as ``F.scaled_dot_product_attention`` gives. On the
    CPU a low-precision softmax runs in float32 and is rounded once at the end.
    """
    # scaled in place: the product's backward needs only query and key
    scores = torch.matmul(query, key.transpose(-2, -1)).mul_(1 / math.sqrt(query.size(-1)))
    blocked = None if mask is None else ~mask
    if blocked is not None:
        # -inf keeps masked keys at exactly zero weight in any dtype; in place, since the
        # scaling's backward needs no saved scores either
        scores = scores.masked_fill_(blocked, float("-inf"))
    if _fp32_on_cpu(scores):
        weights = scores.softmax(dim=-1, dtype=torch.float32)
    else:
        weights = scores.softmax(dim=-1)
    if blocked is not None and mask is not None and not _every_row_attends(mask):
        weights = weights.masked_fill(blocked, 0.0)  # fully masked rows are NaN after softmax
    return weights.to(query.dtype)


def all_attendable(valid: Tensor) -> bool:
    """Whether every key of ``valid`` (bool, True = may attend) may be attended, so that
    attention can go without a mask (the fused kernel then skips masking). Asked only of CPU
    tensors, where the check costs no device synchronisation; False elsewhere (the caller masks
    anyway; False under torch.compile)."""
    return (
        valid.device.type == "cpu"
        and not torch.compiler.is_compiling()  # a data-dependent branch breaks the graph
        and bool(valid.all())
    )


def grouped_queries_path(query: Tensor, path: AttentionPath = "auto") -> AttentionPath:
    """The path for query (B, H, G, K), G > 1 queries of each sentence (the hypotheses of a beam)
    against that sentence's keys, without gradients (decoding): "auto" takes the formula on the
    CPU, whose batched products beat the fused kernel's blocks of G queries there
    (benchmarks/RESULTS.md), unless the native kernel takes it ("auto" kept); any other
    ``path`` is kept."""
    if path == "auto" and query.device.type == "cpu" and not _native_takes(query, None):
        return "formula"
    return path


def _native_takes(query: Tensor, mask: Tensor | None) -> bool:
    """Whether "auto" takes the native kernel: a search step's few float32 queries on the CPU,
    no gradients, a boolean mask or none, the kernels built."""
    return (
        query.device.type == "cpu"
        and query.dtype == torch.float32
        and query.dim() == 4
        and query.size(-2) <= NATIVE_MAX_QUERIES
        and not torch.is_grad_enabled()
        and (mask is None or mask.dtype == torch.bool)
        and native.available()
    )


def cached_attention_runs(like: Tensor) -> bool:
    """Whether ``cached_self_attention`` runs for steps computed like ``like``: float32 on the
    CPU, the native kernels built (what calls it also needs gradients off)."""
    return like.device.type == "cpu" and like.dtype == torch.float32 and native.available()


def cached_self_attention(
    q: Tensor, k: Tensor, v: Tensor, k_buffer: Tensor, v_buffer: Tensor, lineage: Tensor, t: int
) -> Tensor:
    """A one-position search step's self-attention on a cache whose hypothesis rows are never
    gathered (``native.cached_self_attention``, where ``cached_attention_runs``): k (N, H, 1, K),
    v (N, H, 1, Dv) written at position ``t`` of rows 0..N-1 of the buffers (R, capacity, H,
    size), then q (N, H, 1, K) over hypothesis i's positions, p < t in buffer row lineage[i, p]
    (lineage (N, L) int64, L > t; lineage[i, t] set to i) -> (N, H, 1, Dv)."""
    if torch.is_grad_enabled():
        raise RuntimeError("cached_self_attention computes no gradients: call it under no_grad")
    return native.cached_self_attention(q, k, v, k_buffer, v_buffer, lineage, t)


def _last_contiguous(x: Tensor) -> Tensor:
    return x if x.stride(-1) == 1 else x.contiguous()


def _formula_is_faster(query: Tensor, key: Tensor) -> bool:
    """Whether the formula beats the fused kernel here: CPU, gradients on, short keys."""
    return (
        query.device.type == "cpu"
        and torch.is_grad_enabled()
        and key.size(-2) <= FORMULA_MAX_KEYS_CPU_TRAINING
    )


def _causal(n_queries: int, n_keys: int, device: torch.device) -> Tensor:
    # (T, T'): query i sees keys 0 .. i + (T' - T), as transduce.model.masks.causal_mask
    return torch.ones(n_queries, n_keys, dtype=torch.bool, device=device).tril(n_keys - n_queries)


def _fused(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    mask: Tensor | None,
    dropout_p: float,
    is_causal: bool,
) -> Tensor:
    """The fused kernel; on the CPU in float32 for low-precision inputs and outside autocast."""
    if query.device.type != "cpu":
        return F.scaled_dot_product_attention(
            query, key, value, attn_mask=mask, dropout_p=dropout_p, is_causal=is_causal
        )
    dtype = query.dtype
    if dtype in _LOW_PRECISION:
        query, key, value = query.float(), key.float(), value.float()
    # autocast would run it in bfloat16; leaving it costs a few microseconds a call, much of a
    # batch-1 decoding step's attention, so only when it is on
    if torch.is_autocast_enabled("cpu"):
        with torch.autocast("cpu", enabled=False):
            out = F.scaled_dot_product_attention(
                query, key, value, attn_mask=mask, dropout_p=dropout_p, is_causal=is_causal
            )
        return out.to(dtype)
    out = F.scaled_dot_product_attention(
        query, key, value, attn_mask=mask, dropout_p=dropout_p, is_causal=is_causal
    )
    return out if out.dtype == dtype else out.to(dtype)  # the check costs less than .to


def attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    mask: Tensor | None = None,
    *,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    path: AttentionPath = "auto",
) -> Tensor:
    """softmax(Q K^T / sqrt(d_k)) V with dropout ``dropout_p`` on the weights.

    query (B, H, T, K), key (B, H, T', K), value (B, H, T', Dv), mask bool broadcastable to
    (B, H, T, T') with True = may attend. ``is_causal`` (T == T') adds the causal mask without
    building it, which lets the fused kernel skip the masked blocks. Returns (B, H, T, Dv) in the
    dtype of ``query``. ``path``: see ``KernelOptions``.
    """
    if is_causal and query.size(-2) != key.size(-2):  # the two paths align it differently
        raise ValueError(f"is_causal needs T == T'; got {query.size(-2)} and {key.size(-2)}")
    if path == "auto" and dropout_p == 0.0 and not is_causal and _native_takes(query, mask):
        same_rows = key.shape[:2] == query.shape[:2] and value.shape[:3] == key.shape[:3]
        four = key.dim() == value.dim() == 4
        if key.dtype == value.dtype == torch.float32 and four and same_rows:
            b, h, t, s = (*query.shape[:3], key.size(-2))
            m = None if mask is None else mask.expand(b, h, t, s)  # a view
            q, k, v = (_last_contiguous(x) for x in (query, key, value))
            return native.decode_attention(q, k, v, m)
    fused = path == "fused" or (path == "auto" and not _formula_is_faster(query, key))
    if is_causal and (mask is not None or not fused):
        causal = _causal(query.size(-2), key.size(-2), query.device)
        mask = causal if mask is None else mask & causal
        is_causal = False
    if fused:
        return _fused(query, key, value, mask, dropout_p, is_causal)
    weights = attention_weights(query, key, mask)
    if dropout_p > 0.0:
        weights = F.dropout(weights, p=dropout_p)
    return weights @ value


@contextmanager
def training_attention(device: torch.device, *, flash: bool = False) -> Iterator[None]:
    """The fused kernel's backends while a run trains on ``device``: on a CUDA device without
    cuDNN's attention (PyTorch's first choice on Hopper GPUs) and, unless ``flash``, without
    the flash kernel (its next choice), so that PyTorch takes its memory-efficient kernel;
    each restored on leaving. Elsewhere nothing changes; a backend off already stays off, and
    flash stays on where the memory-efficient kernel is off.

    Measured on an H200 (benchmarks/RESULTS.md): the paper's step 1.06-1.16x faster without
    cuDNN's attention (two paired runs; 1.17x on Multi30k batches), and the first pass over an
    epoch's 26 batch shapes 5.9 s against 16.2 s (cuDNN builds a plan for every new batch
    shape); alone, a forward and backward at 12-48 tokens a sentence (8 heads of 64, bf16) took
    the memory-efficient kernel 0.33-0.71 ms, the flash kernel 0.59-1.83 (the decoder's causal
    self-attention took flash), and the paper's step ran 1.10x faster without flash (the median
    of per-round ratios). The rule does not look at lengths: sentences past 48 tokens are not
    measured, where flash may win. The one process-wide setting this package makes, for the
    length of a training run (``Trainer.train``, its validations included): a per-call choice
    would be traced into compiled graphs and cost every call."""
    backends = torch.backends.cuda
    off = []
    if device.type == "cuda" and backends.cudnn_sdp_enabled():
        off.append(backends.enable_cudnn_sdp)
    if (
        device.type == "cuda"
        and not flash
        and backends.flash_sdp_enabled()
        and backends.mem_efficient_sdp_enabled()
    ):
        off.append(backends.enable_flash_sdp)
    try:
        for switch in off:
            switch(False)
        yield
    finally:
        for switch in off:
            switch(True)


__all__ = [
    "FORMULA_MAX_KEYS_CPU_TRAINING",
    "all_attendable",
    "attention",
    "attention_input",
    "attention_weights",
    "cached_attention_runs",
    "cached_self_attention",
    "grouped_queries_path",
    "training_attention",
]
