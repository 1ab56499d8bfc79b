"""Scaled dot-product attention (eq. 1) and multi-head attention (section 3.2.2)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from transduce.model.linear import linear
from transduce.model.masks import causal_mask, combine


_LOW_PRECISION = (torch.bfloat16, torch.float16)

# Training on the CPU with keys at most this long takes the formula rather than the fused kernel:
# PyTorch's CPU flash-attention pays per (batch x head) block, and batches of many short sentences
# have thousands of them. Forward + backward at B=160, H=4, 15 tokens, K=64 on 2 cores: kernel
# 15.5 ms (float32, as attention() runs it), formula 9.4 ms (float32) / 5.3 ms (bfloat16); at 100
# tokens the two are even in float32, at 400 the kernel is faster (benchmarks/attention_paths.py).
FORMULA_MAX_KEYS_CPU_TRAINING = 128


def attention_weights(query: Tensor, key: Tensor, mask: Tensor | None = None) -> Tensor:
    """softmax(Q K^T / sqrt(d_k)) as an explicit formula.

    query (B, H, T, K), key (B, H, T', K), mask bool broadcastable to (B, H, T, T') with True =
    may attend. Returns (B, H, T, T') in the dtype of ``query``. A query row whose keys are all
    masked gets all-zero weights (not NaN), which is what ``F.scaled_dot_product_attention`` does
    too.

    On the CPU a bfloat16/float16 softmax runs in float32 and is rounded once at the end: PyTorch's
    low-precision CPU softmax computes in float32 inside too, but forward + backward took 1.2 ms
    against 0.34 at (64, 8, 24, 24) on 2 cores (benchmarks/RESULTS.md, 2026-11-24).
    """
    # scaled in place: the product's backward needs only query and key
    scores = torch.matmul(query, key.transpose(-2, -1)).mul_(1 / math.sqrt(query.size(-1)))
    upcast = scores.device.type == "cpu" and scores.dtype in _LOW_PRECISION
    blocked = None if mask is None else ~mask
    if blocked is not None:
        # -inf (not a large negative constant) keeps masked keys at exactly zero weight in any
        # dtype; in place, since the scaling's backward needs no saved scores either
        scores = scores.masked_fill_(blocked, float("-inf"))
    weights = scores.softmax(dim=-1, dtype=torch.float32) if upcast else scores.softmax(dim=-1)
    if blocked is not None and not _every_row_attends(mask):
        weights = weights.masked_fill(blocked, 0.0)  # fully masked rows are NaN after softmax
    return weights.to(query.dtype)


def _every_row_attends(mask: Tensor) -> bool:
    """Whether every query row of ``mask`` (bool, broadcastable to (B, H, T, T')) may attend to
    at least one key, so that softmax makes no NaN row. Asked only when training on the CPU, where
    skipping the zeroing pays (a forward and a backward pass over the weights) and the check costs
    no device synchronisation; elsewhere the answer is False and the rows are zeroed anyway, as
    in a decoding step, whose weights are small."""
    return (
        mask.device.type == "cpu" and torch.is_grad_enabled() and bool(mask.any(dim=-1).all())
    )


def _formula_is_faster(query: Tensor, key: Tensor) -> bool:
    """Whether the formula beats the fused kernel here: CPU, gradients on, short keys."""
    return (
        query.device.type == "cpu"
        and torch.is_grad_enabled()
        and key.size(-2) <= FORMULA_MAX_KEYS_CPU_TRAINING
    )


def _fp32_on_cpu(x: Tensor) -> bool:
    """Whether attention on ``x`` runs in float32 although ``x`` is low precision (see
    ``attention``)."""
    return x.device.type == "cpu" and x.dtype in _LOW_PRECISION


def attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    mask: Tensor | None = None,
    dropout_p: float = 0.0,
    fast: bool = True,
    is_causal: bool = False,
) -> Tensor:
    """Attention(Q, K, V) = softmax(Q K^T / sqrt(d_k)) V  (eq. 1).

    query (B, H, T, K), key (B, H, T', K), value (B, H, T', Dv), mask bool broadcastable to
    (B, H, T, T') with True = may attend. ``is_causal`` (needs T == T') adds the causal mask
    (query i sees keys 0..i) without building it, which lets the fused kernel skip the masked
    blocks. Returns (B, H, T, Dv) in the dtype of ``query``. ``dropout_p`` drops attention
    weights (not in the paper; 0 by default). ``fast`` takes the fastest path for the device:
    PyTorch's fused kernel, which computes the same function (see tests/model/test_attention.py),
    except when training on the CPU with short keys, where the formula is faster (see
    ``FORMULA_MAX_KEYS_CPU_TRAINING``). ``fast=False`` is always the formula.

    On the CPU the fused kernel always runs in float32, also for bfloat16/float16 inputs and
    under autocast: PyTorch's CPU flash-attention backward is several times slower in bfloat16
    than in float32 at these head sizes (benchmarks/train_step.py), and float32 is the more
    accurate of the two. The projections around it stay in low precision.
    """
    if fast and _formula_is_faster(query, key):
        fast = False
    if is_causal and (mask is not None or not fast):
        mask = combine(mask, causal_mask(query.size(-2), key.size(-2), device=query.device))
        is_causal = False
    if not fast:
        weights = attention_weights(query, key, mask)
        if dropout_p > 0.0:
            weights = F.dropout(weights, p=dropout_p)
        return weights @ value
    dtype = query.dtype
    if query.device.type == "cpu":
        if dtype in _LOW_PRECISION:
            query, key, value = query.float(), key.float(), value.float()
        # autocast would run it in bfloat16; turning it off costs ~2.7 us a call, 40% of a
        # batch-1 decoding step's attention (6.5 us), so only when it is on
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
    return F.scaled_dot_product_attention(
        query, key, value, attn_mask=mask, dropout_p=dropout_p, is_causal=is_causal
    )


Stacked = tuple[Tensor, Tensor | None]  # stacked projection weight and bias


def _cat_weights(linears: tuple[nn.Linear, ...]) -> Stacked:
    weight = torch.cat([lin.weight for lin in linears])  # (sum(out_features), D)
    bias = None if linears[0].bias is None else torch.cat([lin.bias for lin in linears])
    return weight, bias


class MultiHeadAttention(nn.Module):
    """MultiHead(Q, K, V) = Concat(head_1..head_h) W^O, head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V).

    W^Q, W^K: (D, H*K); W^V: (D, H*Dv); W^O: (H*Dv, D). ``d_k`` and ``d_v`` are independent of
    ``d_model / n_heads`` (Table 3 rows A and B).
    """

    def __init__(
        self,
        *,
        d_model: int,
        n_heads: int,
        d_k: int,
        d_v: int,
        dropout: float = 0.0,
        bias: bool = True,
    ) -> None:
        super().__init__()
        self.n_heads, self.d_k, self.d_v = n_heads, d_k, d_v
        self.dropout = dropout
        self.fast = True
        self.w_q = nn.Linear(d_model, n_heads * d_k, bias=bias)
        self.w_k = nn.Linear(d_model, n_heads * d_k, bias=bias)
        self.w_v = nn.Linear(d_model, n_heads * d_v, bias=bias)
        self.w_o = nn.Linear(n_heads * d_v, d_model, bias=bias)

    def _split(self, x: Tensor, size: int) -> Tensor:
        # (B, T, H*size) -> (B, H, T, size); a view, also of a column slice of a fused projection
        return x.unflatten(-1, (self.n_heads, size)).transpose(1, 2)

    def _project(
        self, x: Tensor, linears: tuple[nn.Linear, ...], stacked: Stacked | None = None
    ) -> tuple[Tensor, ...]:
        """x (B, T, D) through the given projections as one matmul against their stacked weights
        (one GEMM, one input cast under autocast, one backward GEMM per operand instead of
        ``len(linears)``); returns each projection's (B, H, T, size) heads. ``stacked``: those
        weights stacked already (``stack_qkv``), which a decoder cache keeps for its search."""
        sizes = [lin.out_features for lin in linears]
        if len(linears) > 1:
            weight, bias = stacked or _cat_weights(linears)  # (sum(sizes), D), (sum(sizes),)
            out = linear(x, weight, bias)  # (B, T, sum(sizes))
            if self.fast and _fp32_on_cpu(out) and not torch.is_grad_enabled():
                # one cast here rather than one per head tensor in attention(); not in training,
                # where short keys take the formula in low precision (_formula_is_faster)
                out = out.float()
            parts = out.split(sizes, dim=-1)  # each (B, T, size)
        else:
            parts = tuple(linear(x, lin.weight, lin.bias) for lin in linears)
            if self.fast and _fp32_on_cpu(parts[0]) and not torch.is_grad_enabled():
                parts = tuple(p.float() for p in parts)
        return tuple(self._split(p, s // self.n_heads) for p, s in zip(parts, sizes))

    def project_query(self, x: Tensor) -> Tensor:
        """(B, T, D) -> (B, H, T, K)."""
        (q,) = self._project(x, (self.w_q,))
        return q

    def project_key_value(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """(B, T', D) -> keys (B, H, T', K), values (B, H, T', Dv)."""
        k, v = self._project(x, (self.w_k, self.w_v))
        return k, v

    def stack_kv(self) -> Stacked:
        """W^K, W^V stacked (and their biases): (H*K + H*Dv, D)."""
        return _cat_weights((self.w_k, self.w_v))

    def stack_qkv(self) -> Stacked:
        """W^Q, W^K, W^V stacked (and their biases): (H*K + H*K + H*Dv, D)."""
        return _cat_weights((self.w_q, self.w_k, self.w_v))

    def project_qkv(
        self, x: Tensor, stacked: Stacked | None = None
    ) -> tuple[Tensor, Tensor, Tensor]:
        """Self-attention: (B, T, D) -> queries (B, H, T, K), keys (B, H, T, K), values
        (B, H, T, Dv), as one matmul; ``stacked`` from ``stack_qkv`` saves stacking again."""
        q, k, v = self._project(x, (self.w_q, self.w_k, self.w_v), stacked)
        return q, k, v

    def attend(
        self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, is_causal: bool = False
    ) -> Tensor:
        """Projected heads -> (B, T, D): attention per head, concatenation, W^O. ``is_causal``
        as in ``attention``."""
        p = self.dropout if self.training else 0.0
        heads = attention(q, k, v, mask, dropout_p=p, fast=self.fast, is_causal=is_causal)
        b, _, t, _ = heads.shape
        concat = heads.transpose(1, 2).reshape(b, t, self.n_heads * self.d_v)  # (B, T, H*Dv)
        if not torch.is_autocast_enabled(concat.device.type):
            # a low-precision model (attention itself ran in float32 on the CPU, see attention())
            concat = concat.to(self.w_o.weight.dtype)
        return linear(concat, self.w_o.weight, self.w_o.bias)

    def forward(self, query: Tensor, memory: Tensor, mask: Tensor | None = None) -> Tensor:
        """query (B, T, D) attends over memory (B, T', D); mask broadcastable to (B, H, T, T')."""
        if query is memory:  # self-attention: one fused projection
            return self.attend(*self.project_qkv(query), mask)
        k, v = self.project_key_value(memory)
        return self.attend(self.project_query(query), k, v, mask)


def set_fast_attention(module: nn.Module, fast: bool) -> None:
    """Switch every MultiHeadAttention below ``module`` between the fused kernel and the formula."""
    for m in module.modules():
        if isinstance(m, MultiHeadAttention):
            m.fast = fast


__all__ = ["MultiHeadAttention", "attention", "attention_weights", "set_fast_attention"]

