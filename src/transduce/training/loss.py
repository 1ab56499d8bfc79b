"""Label-smoothed cross-entropy (section 5.4) as a pure function."""

from __future__ import annotations

from typing import Any, Literal, NamedTuple

import torch
from torch import Tensor

from transduce.kernels import cross_entropy

# Logit entries handled at once on a CPU (4 MiB of float32: 131 rows of an 8000-word vocabulary),
# so no (N, V) float32 tensor is ever made. On a GPU, kernel launches per chunk cost more than
# memory, so chunks are 64x larger there (still 1 GiB less than a paper-sized batch's log-probs).
_CHUNK_ELEMENTS = 1 << 20
_GPU_CHUNK_FACTOR = 64

# How the loss and its gradient are computed (``label_smoothed_nll``): "fused" computes the
# gradient in the forward pass from one softmax, "reference" recomputes it in the backward pass
# (the textbook two passes; the one for float16 logits); "auto" picks fused except for float16.
LossMethod = Literal["auto", "fused", "reference"]
LOSS_METHODS: tuple[LossMethod, ...] = ("auto", "fused", "reference")


class LossSums(NamedTuple):
    """Sums over the non-padding target tokens of a batch (divide by ``n_tokens`` for means)."""

    loss: Tensor  # label-smoothed cross-entropy, summed
    nll: Tensor  # plain negative log-likelihood, summed (perplexity = exp(nll / n_tokens))
    kept: Tensor  # () int64: the number of non-padding target tokens, on the logits' device

    @property
    def n_tokens(self) -> int:
        """``kept`` as a Python int. Read only where it is needed: on a GPU, reading it waits
        for the forward pass to finish."""
        return int(self.kept)


def label_smoothed_nll(
    logits: Tensor,
    target: Tensor,
    *,
    epsilon: float,
    ignore_index: int,
    method: LossMethod = "auto",
    overwrite_logits: bool = False,
    grad_scale: float = 1.0,
) -> LossSums:
    """Cross-entropy against the smoothed target q = (1 - eps) * onehot(y) + eps / V.

    This is the variant of Szegedy et al. (2016) that ``torch.nn.functional.cross_entropy(...,
    label_smoothing=eps)`` implements: the uniform part spreads eps over all V classes, the true
    class and padding included. Per token it equals (1 - eps) * -log p(y) + (eps / V) * sum_v
    -log p(v). Positions where ``target == ignore_index`` count for nothing.

    logits (B, T, V) (any float dtype; computed in float32), target (B, T).

    Computed a chunk of rows at a time, never with a (B*T, V) float32 tensor: the forward pass
    keeps two numbers per token, -log p(y) and sum_v -log p(v), from a float32 ``log_softmax`` of
    the chunk; the backward pass recomputes the chunk's softmax and writes the gradient, d loss /
    dz = softmax(z) - q, straight into the logits' dtype. The point is memory: the paper's base
    batch (25k target tokens, 37k vocabulary) would otherwise hold several 3.7 GB float32 (N, V)
    tensors. The fused ``log_softmax`` / ``softmax`` kernels, which read bfloat16 logits without
    a float32 copy, also made it faster than the logsumexp form it replaced
    (benchmarks/RESULTS.md).

    ``method`` "fused" (what "auto" takes, but for float16 logits) computes that gradient in the
    forward pass instead, from the one softmax that also gives the loss
    (``_FusedSmoothedCrossEntropy``), so the logits are read once and the backward pass only
    scales it; "reference" is the two-pass computation above. ``overwrite_logits``: the fused
    gradient may be written into ``logits`` itself (they then hold it, not the logits: for a
    caller that only backpropagates them, like the trainer), saving a (B*T, V) tensor; else it
    goes into a new one. On a CUDA GPU with Liger-Kernel installed (the ``gpu`` extra), "auto"
    with ``overwrite_logits`` runs Liger's Triton kernel, which works the same way.

    ``grad_scale``: the gradient the caller will backpropagate into the loss (the trainer's
    ``loss * scale``), for the fused method, which then stores (p - q) * grad_scale, scaled in
    the chunk it computes; its backward pass, handed exactly that gradient on a CPU, returns
    the stored one as it is, without another pass over the (N, V) tensor (benchmarks/
    RESULTS.md). Any other incoming gradient is still honoured. The reference method and Liger
    ignore it.
    """
    if method not in LOSS_METHODS:
        raise ValueError(f"method must be one of {', '.join(LOSS_METHODS)}, not {method!r}")
    if method == "auto" and overwrite_logits and _liger_takes(logits):
        return _liger_sums(logits.flatten(0, -2), target.flatten(), epsilon, ignore_index)
    keep = target != ignore_index  # (B, T)
    args = (logits.flatten(0, -2), target.flatten().clamp(min=0), keep.flatten(), float(epsilon))
    if _fused(method, logits):
        loss, nll = _FusedSmoothedCrossEntropy.apply(*args, overwrite_logits, float(grad_scale))
    else:
        loss, nll = _SmoothedCrossEntropy.apply(*args)
    return LossSums(loss=loss, nll=nll, kept=keep.sum())


def _liger_takes(logits: Tensor) -> bool:
    """Whether Liger's kernel computes the loss of ``logits``: on a CUDA GPU with Liger, not
    float16 (see ``_fused``), logits that may be overwritten and a gradient wanted."""
    return (
        logits.dtype != torch.float16
        and logits.requires_grad
        and torch.is_grad_enabled()
        and cross_entropy.liger_available(logits.device)
    )


def _liger_sums(logits: Tensor, target: Tensor, epsilon: float, ignore_index: int) -> LossSums:
    """``LossSums`` of logits (N, V), target (N,) by Liger's kernel. Its smoothed loss is, per
    row, lse - (1 - eps) z_t - eps mean_v z_v, so the NLL it does not give, lse - z_t, is that
    loss + eps (mean_v z_v - z_t): one read of the logits (a row sum) before the kernel
    overwrites them, where a logsumexp pass took four (profile_step.py on an H200: 12% of the
    paper step)."""
    keep = target != ignore_index  # (N,)
    shift = torch.zeros((), dtype=torch.float32, device=logits.device)
    if epsilon:  # without smoothing the loss is the NLL
        with torch.no_grad():
            z_t = logits.gather(1, target.clamp(min=0)[:, None]).squeeze(1).float()  # (N,)
            z_mean = logits.sum(dim=-1, dtype=torch.float32) / logits.size(1)  # (N,)
            shift = epsilon * ((z_mean - z_t) * keep).sum()
    loss = cross_entropy.liger_smoothed_cross_entropy_sum(
        logits, target, epsilon=epsilon, ignore_index=ignore_index
    )
    return LossSums(loss=loss, nll=loss.detach().float() + shift, kept=keep.sum())


def _fused(method: LossMethod, logits: Tensor) -> bool:
    """Whether ``method`` means the fused computation for ``logits``: "auto" takes it but for
    float16 logits, whose gradient (up to 1e-8 an entry) would flush to 0 in float16 before the
    loss scale multiplies it; the reference scales in float32 first."""
    if method == "auto":
        return logits.dtype != torch.float16
    return method == "fused"


def _chunk_rows(logits: Tensor) -> int:
    elements = _CHUNK_ELEMENTS * (1 if logits.device.type == "cpu" else _GPU_CHUNK_FACTOR)
    return max(1, elements // max(logits.size(1), 1))


class _SmoothedCrossEntropy(torch.autograd.Function):
    """(summed smoothed loss, summed NLL) of logits (N, V) against target (N,) where keep (N,)."""

    @staticmethod
    def forward(
        ctx: Any, logits: Tensor, target: Tensor, keep: Tensor, eps: float
    ) -> tuple[Tensor, Tensor]:
        n, v = logits.shape
        step = _chunk_rows(logits)
        nll_rows = torch.empty(n, dtype=torch.float32, device=logits.device)  # (N,) -log p(y)
        smooth_rows = torch.empty_like(nll_rows)  # (N,) sum_v -log p(v)
        for i in range(0, n, step):
            # one fused kernel reads the chunk in its own dtype and writes float32 log-probs
            logp = torch.log_softmax(logits[i : i + step], dim=-1, dtype=torch.float32)
            smooth_rows[i : i + step] = logp.sum(dim=-1).neg_()
            nll_rows[i : i + step] = logp.gather(1, target[i : i + step, None]).squeeze(1).neg_()
        w = keep.float()  # (N,)
        nll = (nll_rows * w).sum()
        loss = (1.0 - eps) * nll + (eps / v) * (smooth_rows * w).sum()
        ctx.save_for_backward(logits, target, w)
        ctx.eps = eps
        return loss, nll

    @staticmethod
    def backward(
        ctx: Any, g_loss: Tensor | None, g_nll: Tensor | None
    ) -> tuple[Tensor | None, ...]:
        logits, target, w = ctx.saved_tensors
        eps, v = ctx.eps, logits.size(1)
        zero = torch.zeros((), dtype=torch.float32, device=logits.device)
        g_loss = zero if g_loss is None else g_loss.float()
        g_nll = zero if g_nll is None else g_nll.float()
        # d/dz of g_loss * loss + g_nll * nll, per row with weight w (1 kept, 0 padding):
        #   w * [(g_loss + g_nll) * p - (g_loss * (1 - eps) + g_nll) * onehot(y) - g_loss * eps / V]
        row_p = w * (g_loss + g_nll)  # (N,)
        row_y = w * (g_loss * (1.0 - eps) + g_nll)
        row_u = w * (g_loss * (eps / v))
        grad = torch.empty_like(logits)
        step = _chunk_rows(logits)
        for i in range(0, logits.size(0), step):
            rows = slice(i, i + step)
            p = torch.softmax(logits[rows], dim=-1, dtype=torch.float32)  # (n_chunk, V)
            p.mul_(row_p[rows, None]).sub_(row_u[rows, None])
            p.scatter_add_(1, target[rows, None], -row_y[rows, None])
            grad[rows] = p
        return grad, None, None, None


def _zero_rows(x: Tensor, keep: Tensor) -> None:
    """x (N, V)'s rows where keep (N,) is False set to 0, in place: on the CPU only those rows
    are written (a boolean mask would pass over all of x); on a GPU without reading the mask
    back to the host, which would wait for the queued work."""
    if x.device.type == "cpu":
        drop = (~keep).nonzero().squeeze(1)  # (n_padding,)
        if drop.numel():
            x.index_fill_(0, drop, 0.0)
    else:
        x.mul_(keep[:, None].to(x.dtype))


def _is_exactly(g: Tensor, value: float) -> bool:
    """Whether the 0-dim ``g`` holds ``value``, asked of CPU tensors only: a GPU's would be read
    back to the host, waiting for its queued work (there the multiply stays)."""
    return g.device.type == "cpu" and g.item() == value


def _chunked_rows(
    logits: Tensor, target: Tensor, eps: float, grad_scale: float, grad: Tensor | None
) -> tuple[Tensor, Tensor, Tensor]:
    """PyTorch's form of ``_FusedSmoothedCrossEntropy``'s pass over logits (N, V), a chunk of
    rows at a time: (lse, z_y, z_sum), each (N,) float32, and with ``grad`` (N, V) (it may be
    the logits) (p - q) * grad_scale written into it, padding rows not yet zeroed."""
    n, v = logits.shape
    step = _chunk_rows(logits)
    lse = torch.empty(n, dtype=torch.float32, device=logits.device)  # (N,) log sum exp z
    z_y = torch.empty_like(lse)  # (N,) z at the target
    z_sum = torch.empty_like(lse)  # (N,) sum_v z
    for i in range(0, n, step):
        rows = slice(i, i + step)
        chunk, t = logits[rows], target[rows, None]  # (n_chunk, V), (n_chunk, 1)
        if grad is None:  # no gradient wanted (validation): the logits stay as they are
            z = chunk.float()
            z_sum[rows], z_y[rows] = z.sum(dim=-1), z.gather(1, t).squeeze(1)
            lse[rows] = torch.logsumexp(z, dim=-1)
            continue
        # float32 z where its softmax, then p - q, may be computed in place: the gradient's
        # own rows for float32 logits, else a float32 copy of the chunk
        if grad.dtype == torch.float32:
            z = grad[rows] if grad is logits else grad[rows].copy_(chunk)
        else:
            z = chunk.float()
        m = z.amax(dim=-1)  # (n_chunk,)
        z_sum[rows], z_y[rows] = z.sum(dim=-1), z.gather(1, t).squeeze(1)
        p = cross_entropy.softmax_(z)  # (n_chunk, V)
        lse[rows] = m + p.amax(dim=-1).log().neg_()
        p.sub_(eps / v).scatter_add_(1, t, p.new_full(t.shape, eps - 1.0))  # p - q
        if grad_scale != 1.0:
            p.mul_(grad_scale)  # (p - q) * grad_scale, while the chunk is in the cache
        if p.data_ptr() != grad[rows].data_ptr():
            grad[rows] = p
    return lse, z_y, z_sum


class _FusedSmoothedCrossEntropy(torch.autograd.Function):
    """``_SmoothedCrossEntropy`` with the gradient of the loss computed in the forward pass.

    Per chunk of rows, from float32 z: m = max_v z, p = softmax(z), log sum_v exp z =
    m - log max_v p (max_v p >= 1/V: no underflow, unlike log p(y)), so -log p(y) = lse - z_y
    and sum_v -log p(v) = V lse - sum_v z. The gradient of the smoothed loss, p - q, is
    written in the logits' dtype (into the logits with ``overwrite``), padding rows 0: one
    softmax and a few cheap passes where the reference takes a log-softmax, a softmax and
    more passes. The backward pass multiplies it by the loss's incoming gradient; the NLL's
    gradient, p - onehot(y) = (p - q) + eps / V - eps onehot(y), comes from it too.

    On the CPU (float32 or bfloat16 logits) the native kernel does all of it in one pass a row,
    the row widened to float32 in the cache (``cross_entropy.native_smoothed_rows``), where
    the chunks copy the logits to float32 and the gradient back: ~2.7x faster on the paper's
    vocabulary (``benchmarks/native_kernels.py``, benchmarks/RESULTS.md); its exp and sums
    differ from PyTorch's in the last float32 bits.
    """

    @staticmethod
    def forward(
        ctx: Any,
        logits: Tensor,
        target: Tensor,
        keep: Tensor,
        eps: float,
        overwrite: bool,
        grad_scale: float,
    ) -> tuple[Tensor, Tensor]:
        v = logits.size(1)
        grad: Tensor | None = None  # (N, V) (p - q) * grad_scale, in the logits' dtype
        if ctx.needs_input_grad[0]:
            in_place = overwrite and logits.is_contiguous()
            grad = (
                logits
                if in_place
                else torch.empty_like(logits, memory_format=torch.contiguous_format)
            )
        if cross_entropy.native_takes(logits):  # one pass, padding rows zeroed by the kernel
            lse, z_y, z_sum = cross_entropy.native_smoothed_rows(
                logits, target, keep, eps, grad_scale, grad
            )
            if grad is logits:  # written behind autograd's back: an op that saved them refuses
                torch.autograd.graph.increment_version(logits)
        else:
            lse, z_y, z_sum = _chunked_rows(logits, target, eps, grad_scale, grad)
            if grad is not None:
                _zero_rows(grad, keep)  # padding counts for nothing
        w = keep.float()  # (N,)
        nll_rows = lse - z_y  # (N,) -log p(y)
        nll = (nll_rows * w).sum()
        loss = (1.0 - eps) * nll + (eps / v) * ((v * lse - z_sum) * w).sum()
        if grad is not None:
            # detached: the logits may be a view, which autograd would not let a Function
            # save once written in place
            ctx.save_for_backward(grad.detach(), target, w)
        ctx.eps = eps
        # grad_scale as the float32 gradient that autograd will hand the loss, and the fp32 math
        # of the multiply above (a Python float is rounded to float32 there too)
        ctx.grad_scale = float(torch.tensor(grad_scale, dtype=torch.float32))
        ctx.set_materialize_grads(False)
        return loss, nll

    @staticmethod
    def backward(
        ctx: Any, g_loss: Tensor | None, g_nll: Tensor | None
    ) -> tuple[Tensor | None, ...]:
        grad, target, w = ctx.saved_tensors  # grad (N, V): (p - q) * s, 0 on padding rows
        scale = ctx.grad_scale  # s
        none = (None,) * 5
        if g_nll is None:  # the common case: one pass over the stored gradient, in place
            if g_loss is None:
                return None, *none
            if _is_exactly(g_loss, scale):  # the promised gradient: stored already
                return grad, *none
            # a float32 0-dim g_loss: computed in float32, rounded once (not rounded first). In
            # place: a second backward (retain_graph) is refused by autograd's version check.
            return grad.mul_(g_loss if scale == 1.0 else g_loss / scale), *none
        # g_loss (p - q) + g_nll (p - onehot(y)) = (g_loss + g_nll) (p - q)
        #                                          + g_nll eps / V - g_nll eps onehot(y), kept rows
        eps, v = ctx.eps, grad.size(1)
        g = g_nll.float() if g_loss is None else g_loss.float() + g_nll.float()
        out = grad.float().mul_(g / scale).add_((w * (g_nll.float() * eps / v))[:, None])
        out.scatter_add_(1, target[:, None], (w * (-g_nll.float() * eps))[:, None])
        return out.to(grad.dtype), *none
