"""The layers of ``benchmarks/table1.py`` and their arithmetic: the paper's Table 1 rows at d = 512.

Every layer maps a batch of 1 sequence of n vectors of d = 512 to the same shape, float32:

    self-attention       transduce's ``MultiHeadAttention``, 8 heads of d_k = d_v = 64 (the paper's
                         base): the stacked W^Q W^K W^V product, attention on transduce's own path
                         (``kernels.attention``, "auto"), W^O
    self-attention core  that attention alone, softmax(QK^T/sqrt(d_k))V on given Q, K, V
                         (B, 8, n, 64): what the table's O(n^2 d) describes
    recurrent            ``nn.LSTM(512, 512)``, one layer; its n steps run one after the other
                         (on the CPU PyTorch runs them inside one oneDNN call)
    convolutional        ``nn.Conv1d(512, 512, kernel_size=3, padding=1)``: k = 3, not separable,
                         not dilated
    restricted           the same layer (same weights) with each query attending only the keys
                         within r/2 = 32 positions of it (the paper's neighbourhood of size r = 64
                         centred on the query), in O(r n d): queries in blocks of r/2, each block
                         against its own and both neighbouring blocks of keys (3r/2 keys, 1.5x the
                         r + 1 needed, all counted), masked to the band (``banded_attention``)
    restricted core      that banded attention alone, on Q, K, V as the core above

Model FLOPs (``forward_flops``, ``backward_flops``): 2 per multiply-add of the matrix products
(softmax, biases and gate nonlinearities left out); backward twice the forward (the LSTM's minus
one step's product: its constant initial state gets no gradient). The attention layers add
8 n d^2 for the four projections to the core's 4 n^2 d (full) or 12 n' (r/2) d (banded, n'
= n rounded up to a whole block). ``counted_flops`` gets the same from PyTorch's FLOP counter.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable

import torch
from torch import Tensor, nn

from transduce import kernels
from transduce.kernels import AttentionPath, KernelOptions
from transduce.model.attention import MultiHeadAttention, merge_heads

D_MODEL, N_HEADS, KERNEL, NEIGHBOURHOOD, BATCH = 512, 8, 3, 64, 1
LENGTHS = tuple(2**i for i in range(4, 13))  # 16 .. 4096
QUICK_LENGTHS = (16, 64, 256)
RECURRENT = "recurrent"
LAYERS = (
    "self-attention",
    "self-attention core",
    RECURRENT,
    "convolutional",
    "restricted",
    "restricted core",
)
# the paper's columns: complexity per layer, sequential operations, maximum path length
PAPER = {
    "self-attention": ("O(n²·d) + n·d² proj.", "O(1)", "O(1)"),
    "self-attention core": ("O(n²·d)", "O(1)", "O(1)"),
    RECURRENT: ("O(n·d²)", "O(n)", "O(n)"),
    "convolutional": ("O(k·n·d²)", "O(1)", "O(log_k(n))"),
    "restricted": ("O(r·n·d) + n·d² proj.", "O(1)", "O(n/r)"),
    "restricted core": ("O(r·n·d)", "O(1)", "O(n/r)"),
}

# --- restricted self-attention in O(r n d) -------------------------------------------------------


def band_mask(n: int, half: int, device: torch.device | str = "cpu") -> Tensor:
    """(blocks, half, 3 half) bool, True = may attend: query ``b*half + a`` against window slot
    c, the key at ``(b - 1)*half + c``, when the two are at most ``half`` apart and the key is
    one of the n real ones."""
    blocks = -(-n // half)
    a = torch.arange(half, device=device).view(half, 1)
    c = torch.arange(3 * half, device=device).view(1, 3 * half)
    near = (a + half - c).abs() <= half  # the same in every block
    key = torch.arange(blocks, device=device).view(blocks, 1) * half - half + c  # (blocks, 3 half)
    return near & ((key >= 0) & (key < n)).unsqueeze(1)


def banded_attention(
    q: Tensor, k: Tensor, v: Tensor, half: int, path: AttentionPath = "auto"
) -> Tensor:
    """Restricted self-attention: query i attends key j iff |i - j| <= half.

    q, k (B, H, n, K), v (B, H, n, Dv) -> (B, H, n, Dv). Queries in blocks of ``half`` each
    meet their own and both neighbouring blocks of keys (3 half of them), so the cost is
    O(n half d), never n^2. ``path``: transduce's attention path (``KernelOptions.attention``).
    """
    n = q.size(-2)
    blocks = -(-n // half)
    tail = blocks * half - n
    qb = nn.functional.pad(q, (0, 0, 0, tail)).unflatten(-2, (blocks, half))  # (B, H, nb, half, K)
    kb, vb = (_windows(x, half, tail, blocks) for x in (k, v))  # (B, H, nb, 3 half, K or Dv)
    mask = band_mask(n, half, q.device)
    out = kernels.attention(qb, kb, vb, mask, path=path)
    return out.flatten(-3, -2)[..., :n, :]  # every real query has itself as a key: no NaN row


def _windows(x: Tensor, half: int, tail: int, blocks: int) -> Tensor:
    """(B, H, n, K) -> (B, H, blocks, 3 half, K): block b's keys and those of both neighbours,
    with a block of zeros beyond either end. Concatenated shifted views, not ``unfold``: the
    backward of a concatenation is slicing, the strided view's is slower (25 against 35 ms at
    n = 1024)."""
    xb = nn.functional.pad(x, (0, 0, half, tail + half)).unflatten(-2, (blocks + 2, half))
    return torch.cat([xb[..., :-2, :, :], xb[..., 1:-1, :, :], xb[..., 2:, :, :]], dim=-2)


# --- the layers: (B, n, d) -> (B, n, d) ---------------------------------------------------------


class RestrictedSelfAttention(nn.Module):
    """Multi-head self-attention with ``banded_attention`` in place of full attention."""

    def __init__(self, mha: MultiHeadAttention, half: int) -> None:
        super().__init__()
        self.mha, self.reach = mha, half  # not self.half: nn.Module.half() casts to float16

    def forward(self, x: Tensor) -> Tensor:
        q, k, v = self.mha.project_qkv(x)  # each (B, H, n, 64)
        out = banded_attention(q, k, v, self.reach, self.mha.options.attention)
        return self.mha.w_o(merge_heads(out))


class SelfAttention(nn.Module):
    """transduce's multi-head self-attention layer as a one-argument module."""

    def __init__(self, mha: MultiHeadAttention) -> None:
        super().__init__()
        self.mha = mha

    def forward(self, x: Tensor) -> Tensor:
        return self.mha(x, x)


class Recurrent(nn.Module):
    """One LSTM layer of hidden size d, batch first; its outputs (B, n, d)."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.lstm = nn.LSTM(d, d, batch_first=True)

    def forward(self, x: Tensor) -> Tensor:
        return self.lstm(x)[0]


class Convolution(nn.Module):
    """Conv1d d -> d, kernel k, 'same' padding, over the positions of (B, n, d)."""

    def __init__(self, d: int, k: int) -> None:
        super().__init__()
        self.conv = nn.Conv1d(d, d, k, padding=k // 2)

    def forward(self, x: Tensor) -> Tensor:
        return self.conv(x.transpose(1, 2)).transpose(1, 2)  # channels are d


class Core(nn.Module):
    """An attention core on (q, k, v) of (B, H, n, d/H); no weights."""

    def __init__(self, fn: Callable[[Tensor, Tensor, Tensor], Tensor]) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        return self.fn(q, k, v)


def make_layers(
    device: torch.device, options: KernelOptions = KernelOptions()
) -> dict[str, nn.Module]:
    """Every layer of ``LAYERS`` at d = 512 on ``device``, float32, fixed seed."""
    torch.manual_seed(0)
    mha = MultiHeadAttention(
        d_model=D_MODEL,
        n_heads=N_HEADS,
        d_k=D_MODEL // N_HEADS,
        d_v=D_MODEL // N_HEADS,
        options=options,
    )
    half, path = NEIGHBOURHOOD // 2, options.attention
    layers: dict[str, nn.Module] = {
        "self-attention": SelfAttention(mha),
        "self-attention core": Core(lambda q, k, v: kernels.attention(q, k, v, path=path)),
        RECURRENT: Recurrent(D_MODEL),
        "convolutional": Convolution(D_MODEL, KERNEL),
        "restricted": RestrictedSelfAttention(mha, half),
        "restricted core": Core(lambda q, k, v: banded_attention(q, k, v, half, path)),
    }
    return {name: layer.to(device) for name, layer in layers.items()}


def make_inputs(layer: str, n: int, device: torch.device, batch: int = BATCH) -> tuple[Tensor, ...]:
    """The inputs of ``layer`` at length n, requiring gradients: x (B, n, d), or q, k, v
    (B, H, n, d/H) for a core."""
    g = torch.Generator().manual_seed(n)
    if layer.endswith("core"):
        shape: tuple[int, ...] = (batch, N_HEADS, n, D_MODEL // N_HEADS)
        return tuple(torch.randn(shape, generator=g).to(device).requires_grad_() for _ in range(3))
    return (torch.randn(batch, n, D_MODEL, generator=g).to(device).requires_grad_(),)


# --- the arithmetic: pure functions --------------------------------------------------------------


def forward_flops(
    layer: str,
    n: int,
    *,
    d: int = D_MODEL,
    k: int = KERNEL,
    r: int = NEIGHBOURHOOD,
    batch: int = BATCH,
) -> int:
    """Forward model FLOPs of ``layer`` at length n (2 per multiply-add of the products)."""
    half = r // 2
    padded = -(-n // half) * half
    core = {
        "self-attention": 4 * n * n * d,  # Q K^T and A V over all heads: 2 n^2 d each
        "restricted": 12 * padded * half * d,  # each query against 3 half keys, twice
    }
    if layer.endswith("core"):
        return batch * core[layer.removesuffix(" core")]
    if layer in core:
        return batch * (8 * n * d * d + core[layer])  # + x W^Q, x W^K, x W^V and heads W^O
    if layer == RECURRENT:
        return batch * 16 * n * d * d  # 4 gates from input and from state: 2 (4d x d) per step
    if layer == "convolutional":
        return batch * 2 * k * n * d * d
    raise KeyError(layer)


def backward_flops(layer: str, n: int, **sizes: int) -> int:
    """Backward model FLOPs: each product's two gradient products; the LSTM's initial state is
    a constant, so one step's gradient product (4d x d) is not computed."""
    d, batch = sizes.get("d", D_MODEL), sizes.get("batch", BATCH)
    skipped = 8 * d * d * batch if layer == RECURRENT else 0
    return 2 * forward_flops(layer, n, **sizes) - skipped


def sequential_ops(layer: str, n: int) -> int:
    """The paper's minimum number of sequential operations: n for the recurrent layer, else 1."""
    return n if layer == RECURRENT else 1


def max_path(layer: str, n: int, *, k: int = KERNEL, r: int = NEIGHBOURHOOD) -> float:
    """The paper's maximum path length with its constants dropped (convolutions: dilated)."""
    return {
        "recurrent": float(n),
        "convolutional": math.log(n, k),
        "restricted": n / r,
        "restricted core": n / r,
    }.get(layer, 1.0)


def counted_flops(layer: str, n: int, batch: int = BATCH) -> tuple[int, int]:
    """(forward, backward) FLOPs by ``FlopCounterMode`` on the CPU, with every product where it
    sees them: MKL (oneDNN's operator is invisible to it), the attention formula (it counts no
    CPU fused kernel), the LSTM's per-step products (not oneDNN's one opaque call)."""
    from torch.utils.flop_counter import FlopCounterMode

    options = KernelOptions(matmul="mkl", attention="formula")
    module = make_layers(torch.device("cpu"), options)[layer]
    inputs = make_inputs(layer, n, torch.device("cpu"), batch)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the flags' note on TF32 for Intel GPUs
        with torch.backends.mkldnn.flags(enabled=False):
            with FlopCounterMode(display=False) as fwd:
                out = module(*inputs)
            with FlopCounterMode(display=False) as bwd:
                out.backward(torch.ones_like(out))
    return fwd.get_total_flops(), bwd.get_total_flops()
