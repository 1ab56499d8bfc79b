"""The k best log-probabilities of each row of logits, without the (N, V) log-probabilities.

A beam step needs, of each hypothesis's row of logits (N, V), only the k best next tokens and
their log-probabilities ``x_i - lse(x)``, with a few ids (PAD, BOS) never chosen. Written as
``log_softmax`` then ``topk``, that reads and writes the (N, V) matrix in float32 several
times: on an H200 at 512 x 58,101 the ``topk`` alone took 22% of a static beam search's device
time (benchmarks/RESULTS.md). Here the row is cut into tiles of ``BLOCK`` entries, and one
pass over each tile (one Triton program) gives:

- the tile's maximum m_t and sum of exp(x - m_t) (s_t), from which the row's log-sum-exp is
  lse = M + log(sum_t s_t exp(m_t - M)), M = max_t m_t;
- the tile's k best entries that are not excluded (k rounds of max, first index of it, masked).

The k best of the row are the k best of its tiles' k best (a tile holding j of the row's best
holds them among its own k best); their log-probabilities are the logits minus lse. A tile's
stage runs in Triton on CUDA (``pays``), and as torch operations anywhere (``tiles_torch``,
the reference the tests hold the kernel to, on CPUs through Triton's interpreter).
Shapes: N rows, V the vocabulary, T tiles a row (ceil(V / BLOCK)), k the entries kept a row.
"""

from __future__ import annotations

import contextlib
import functools
import math
import warnings
from typing import Any

import torch
from torch import Tensor

from transduce.kernels import native

# entries a tile; k rounds of a max over it cost the program more than reading it
BLOCK = 2048
# the largest k taken this way (k rounds over every tile); beyond, torch.topk
MAX_K = 16
# the largest k of the CPU's native kernel (a sorted insertion a candidate); beyond, torch.topk
NATIVE_MAX_K = 64


@functools.lru_cache(maxsize=1)
def _triton() -> Any:
    """The jitted tile kernel, or None where Triton cannot be imported."""
    try:
        import triton
        import triton.language as tl
    except Exception:  # ImportError, or a Triton that fails to load
        return None

    @triton.jit
    def tile_kernel(  # type: ignore[no-untyped-def]
        x_ptr, row_stride, v, lo, hi, top_v, top_i, tile_m, tile_s, n_tiles,
        K: tl.constexpr, BLOCK: tl.constexpr,
    ):  # fmt: skip
        row = tl.program_id(0).to(tl.int64)  # row * row_stride may pass 2**31
        tile = tl.program_id(1)
        offs = tl.arange(0, BLOCK)
        cols = tile * BLOCK + offs
        x = tl.load(x_ptr + row * row_stride + cols, mask=cols < v, other=float("-inf"))
        x = x.to(tl.float32)
        m = tl.max(x, axis=0)
        m_safe = tl.where(m == float("-inf"), 0.0, m)  # a tile of -inf only: s = 0, not nan
        s = tl.sum(tl.exp(x - m_safe), axis=0)
        out = row * n_tiles + tile
        tl.store(tile_m + out, m)
        tl.store(tile_s + out, s)
        y = tl.where((cols >= lo) & (cols <= hi), float("-inf"), x)
        for j in tl.static_range(K):
            best = tl.max(y, axis=0)
            first = tl.min(tl.where(y == best, offs, BLOCK), axis=0)  # first index of the max
            tl.store(top_v + out * K + j, best)
            tl.store(top_i + out * K + j, tile * BLOCK + first)
            y = tl.where(offs == first, float("-inf"), y)

    return tile_kernel


def available() -> bool:
    """Whether Triton can be imported (its kernel runs on CUDA, or on CPU tensors under
    ``TRITON_INTERPRET=1``)."""
    return _triton() is not None


def pays(device: torch.device, k: int) -> bool:
    """Whether a search step's candidates come from ``log_softmax_topk`` on ``device``: CUDA
    GPUs where the Triton kernel runs (``runs_on``), k <= MAX_K; CPUs where the native kernel
    is built (``kernels.native``), k <= NATIVE_MAX_K. Elsewhere ``log_softmax`` and a top-k
    (``inference/topk.py``)."""
    if device.type == "cpu":
        return k <= NATIVE_MAX_K and native.available()
    return device.type == "cuda" and k <= MAX_K and available() and runs_on(device, k)


def native_takes(logits: Tensor, k: int, lo: int, hi: int) -> bool:
    """Whether the CPU's native kernel takes these logits (N, V): built, on the CPU, and
    1 <= k <= NATIVE_MAX_K and the columns outside lo..hi (the kernel needs k of them)."""
    v = logits.size(-1)
    choosable = v - max(0, min(hi, v - 1) - max(lo, 0) + 1)
    return (
        logits.device.type == "cpu" and 0 < k <= min(NATIVE_MAX_K, choosable) and native.available()
    )


def best_pays(device: torch.device) -> bool:
    """Whether greedy search's best token comes from ``log_softmax_topk`` with k = 1: CPUs where
    the native kernel is built (3-8x a log_softmax and a max over 8,000-37,000 words,
    benchmarks/RESULTS.md); on CUDA unmeasured, so ``log_softmax`` and a max."""
    return device.type == "cpu" and native.available()


# (device, k) -> whether the kernel ran there and agreed with the torch stage (tried once)
_RUNS_ON: dict[tuple[str, int], bool] = {}


def runs_on(device: torch.device, k: int) -> bool:
    """Whether the Triton kernel for ``k`` (a constant it is compiled for) compiles and runs on
    ``device`` and agrees with ``tiles_torch`` there, tried once on a small case. An importable
    Triton may still fail at its first launch (no C compiler to build its launcher, a GPU or
    driver it does not support): beam search then keeps the old way, with a warning, rather
    than fail."""
    key = (str(device), k)
    if key not in _RUNS_ON:
        try:
            x = torch.arange(3 * (BLOCK + 9), dtype=torch.float32, device=device)
            x = (x * 0.618).remainder(7.0).view(3, BLOCK + 9)  # (3, BLOCK + 9), few ties
            got = log_softmax_topk(x, k, 0, 1, use_triton=True)
            want = log_softmax_topk(x, k, 0, 1, use_triton=False)
            works = bool(torch.allclose(got[0], want[0], atol=1e-5)) and bool(
                torch.equal(got[1], want[1])
            )
            why = "its results differ from torch's"
        except Exception as e:  # a compiler, a driver, a GPU Triton does not support
            works, why = False, f"{type(e).__name__}: {' '.join(str(e).split())[:200]}"
        if not works:
            warnings.warn(
                f"the Triton top-k kernel does not run on {device} ({why}); beam search "
                "takes log_softmax and a top-k there",
                RuntimeWarning,
                stacklevel=3,  # the search that asked
            )
        _RUNS_ON[key] = works
    return _RUNS_ON[key]


def tiles_triton(logits: Tensor, k: int, lo: int, hi: int) -> tuple[Tensor, ...]:
    """The tile stage in Triton: logits (N, V), last dim contiguous -> (values (N, T*k) float32,
    columns (N, T*k) int64, m (N, T), s (N, T)). Columns lo..hi are never among the values."""
    kernel = _triton()
    if kernel is None:
        raise RuntimeError("Triton is not installed")
    if logits.stride(1) != 1:
        logits = logits.contiguous()
    n, v = logits.shape
    n_tiles = math.ceil(v / BLOCK)
    dev = logits.device
    top_v = torch.empty(n, n_tiles * k, dtype=torch.float32, device=dev)
    top_i = torch.empty(n, n_tiles * k, dtype=torch.int32, device=dev)
    tile_m = torch.empty(n, n_tiles, dtype=torch.float32, device=dev)
    tile_s = torch.empty(n, n_tiles, dtype=torch.float32, device=dev)
    if n:
        grid = (n, n_tiles)
        with torch.cuda.device(dev) if dev.type == "cuda" else contextlib.nullcontext():
            # Triton launches on the current GPU: the logits' own
            kernel[grid](
            logits, logits.stride(0), v, lo, hi, top_v, top_i, tile_m, tile_s, n_tiles,
            K=k, BLOCK=BLOCK, num_warps=8,
            )  # fmt: skip
    return top_v, top_i.long(), tile_m, tile_s


def tiles_torch(logits: Tensor, k: int, lo: int, hi: int) -> tuple[Tensor, ...]:
    """``tiles_triton``'s results as torch operations (the reference; any device)."""
    n, v = logits.shape
    n_tiles = math.ceil(v / BLOCK)
    x = torch.full((n, n_tiles * BLOCK), float("-inf"), device=logits.device)
    x[:, :v] = logits.float()
    x = x.view(n, n_tiles, BLOCK)  # (N, T, BLOCK)
    m = x.amax(dim=2)  # (N, T)
    m_safe = torch.where(m == float("-inf"), 0.0, m)
    s = (x - m_safe[..., None]).exp().sum(dim=2)  # (N, T)
    cols = torch.arange(n_tiles * BLOCK, device=logits.device).view(n_tiles, BLOCK)  # (T, BLOCK)
    y = x.masked_fill((cols >= lo) & (cols <= hi), float("-inf"))
    # stable sort: the first index of equal values first, as the kernel's rounds take them
    values, pos = y.sort(dim=2, descending=True, stable=True)  # (N, T, BLOCK)
    top_v = values[..., :k].reshape(n, n_tiles * k)  # (N, T, k) -> (N, T*k)
    top_i = pos[..., :k] + cols[:, :1]  # (N, T, k)
    # a padded column (past V, -inf) named as the kernel names it: the tile's first column
    top_i = torch.where(top_i < v, top_i, cols[:, :1]).reshape(n, n_tiles * k)
    return top_v, top_i, m, s


def log_softmax_topk(
    logits: Tensor,
    k: int,
    lo: int,
    hi: int,
    *,
    use_triton: bool | None = None,
    force: Tensor | None = None,
    forced: int = -1,
) -> tuple[Tensor, Tensor]:
    """logits (N, V) -> (values (N, k) float32, indices (N, k)): the k largest entries of each
    row of ``log_softmax(logits.float())`` with columns lo..hi excluded (set to -inf there),
    best first; ``topk``'s values (where values tie, the indices may differ). ``use_triton``:
    None = on a CPU the native kernel where it is built (``kernels.native``; values within a
    few float32 ulps of log_softmax's), else the Triton kernel where it runs (``pays``; or a CPU
    under Triton's interpreter); False = ``tiles_torch``. Rows where ``force`` (N,) bool is
    True (a search's last step, EOS forced) hold column ``forced``'s log-probability first,
    then -inf at the first other columns outside lo..hi."""
    on_cpu = logits.device.type == "cpu"
    if use_triton is None and on_cpu and not _interpreting() and native_takes(logits, k, lo, hi):
        return native.log_softmax_topk(logits.float(), k, lo, hi, force, forced)
    if not 0 < k <= min(MAX_K, BLOCK):
        raise ValueError(f"k must be 1..{MAX_K}, not {k}")
    if use_triton is None:
        use_triton = (not on_cpu and pays(logits.device, k)) or (available() and _interpreting())
    stage = tiles_triton if use_triton else tiles_torch
    top_v, top_i, m, s = stage(logits, k, lo, hi)
    big = m.amax(dim=1, keepdim=True)  # (N, 1)
    big_safe = torch.where(big == float("-inf"), 0.0, big)
    lse = big_safe + (s * (m - big_safe).exp()).sum(dim=1, keepdim=True).log()  # (N, 1)
    values, pos = top_v.topk(k, dim=1)  # (N, k) of the (N, T*k) candidates
    values, indices = values - lse, top_i.gather(1, pos)
    if force is None:
        return values, indices
    return _forced_rows(logits, values, indices, lse, lo, hi, force, forced)


def _forced_rows(
    logits: Tensor,
    values: Tensor,
    indices: Tensor,
    lse: Tensor,
    lo: int,
    hi: int,
    force: Tensor,
    forced: int,
) -> tuple[Tensor, Tensor]:
    """values, indices (N, k) with the rows where ``force`` (N,) replaced by column ``forced``'s
    log-probability (logit - lse, lse (N, 1)), then -inf at the first columns outside lo..hi
    and not ``forced`` (the native kernel's choice): no read of the device."""
    n, k = values.shape
    first = logits.narrow(1, forced, 1).float() - lse  # (N, 1)
    forced_v = torch.cat([first, first.new_full((n, k - 1), float("-inf"))], 1)  # (N, k)
    forced_i = _forced_columns(k, lo, hi, forced, indices.device).expand(n, k)
    rows = force.view(n, 1)
    return torch.where(rows, forced_v, values), torch.where(rows, forced_i, indices)


@functools.lru_cache(maxsize=64)
def _forced_columns(k: int, lo: int, hi: int, forced: int, device: torch.device) -> Tensor:
    """(k,): ``forced``, then the first k - 1 other columns outside lo..hi; made once a device
    (a search's forced steps would each copy it to the device)."""
    cols: list[int] = [forced]
    c = 0
    while len(cols) < k:
        if not lo <= c <= hi and c != forced:
            cols.append(c)
        c += 1
    return torch.tensor(cols, device=device)


@functools.lru_cache(maxsize=1)
def _interpreting() -> bool:
    """Whether Triton runs kernels in its interpreter (``TRITON_INTERPRET=1``), read once: Triton
    reads it when a kernel is defined (and a greedy step at batch 1 felt the read)."""
    import os

    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


__all__ = [
    "BLOCK",
    "best_pays",
    "native_takes",
    "MAX_K",
    "NATIVE_MAX_K",
    "available",
    "log_softmax_topk",
    "pays",
    "tiles_torch",
    "tiles_triton",
]
