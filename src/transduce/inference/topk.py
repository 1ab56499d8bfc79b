"""The k largest entries of each row of a wide matrix, found through the maxima of its chunks.

``torch.topk`` on the CPU costs about as much as a partial sort of every row: for the 4 best of
each of a beam step's rows of log-probabilities, about twice the ``log_softmax`` over them
(benchmarks/RESULTS.md). ``chunked_topk`` cuts each row into chunks
of C entries, takes every chunk's maximum (one vectorised reduction over the row), keeps the k
chunks with the largest maxima and takes the k best of their k*C entries, together with the
last V mod C entries of the row, which are in no chunk and are candidates as they are.

Why the k best entries are among them: take the j-th best value v_j of a row (j <= k). Either
the chunks holding the j best entries are all kept (the tail always is), or one of them, c, is
not; then each of the k kept chunks has a maximum >= max(c) >= v_j. Both ways the candidates
hold at least j entries >= v_j, so their j-th best value is v_j.
The values returned are torch.topk's; where values tie, the indices may be other entries holding
the same value.

Where it pays is a kernels rule (``kernels.topk_by_chunks_pays``): on CPUs. On CUDA the beam
step's candidates come from the logits' tiles instead (``next_token_candidates``,
``kernels/topk_tiles.py``: 0.175 ms against the chunks' 0.47 and ``torch.topk``'s 0.68 at
512 x 58,101 on an H200, benchmarks/RESULTS.md).
"""

from __future__ import annotations

import torch
from torch import Tensor

from transduce import kernels
from transduce.data.vocab import BOS, EOS, PAD
from transduce.inference.common import next_token_log_probs

# Entries per chunk, k = 4: the fastest at 4 and 32 rows; 128 was a little faster at 128 rows
# but slower at 32 (benchmarks/RESULTS.md)
CHUNK = 64


def chunked_topk(scores: Tensor, k: int, chunk: int = CHUNK) -> tuple[Tensor, Tensor]:
    """scores (N, V) -> (values (N, k), indices (N, k)): the k largest entries of each row, best
    first, as ``scores.topk(k, dim=1)`` (see the module docstring on ties). Rows too short to
    hold 4k chunks, and devices where it does not pay (``kernels.topk_by_chunks_pays``), go to
    ``torch.topk`` directly."""
    if scores.size(1) // chunk < 4 * k or not kernels.topk_by_chunks_pays(scores.device):
        return scores.topk(k, dim=1)
    return topk_by_chunks(scores, k, chunk)


def topk_by_chunks(scores: Tensor, k: int, chunk: int = CHUNK) -> tuple[Tensor, Tensor]:
    """``chunked_topk``'s way on any device, for rows of at least ``k`` chunks
    (benchmarks/gpu_probe.py times it against ``torch.topk`` on a GPU)."""
    n, v = scores.shape
    n_chunks = v // chunk
    if n_chunks < k:
        raise ValueError(f"{n_chunks} chunks of {chunk} in a row of {v}: fewer than k = {k}")
    body = scores.narrow(1, 0, n_chunks * chunk).reshape(n, n_chunks, chunk)  # (N, n_chunks, chunk)
    best_chunks = body.amax(dim=2).topk(k, dim=1).indices  # (N, k)
    picked = body.gather(1, best_chunks.unsqueeze(2).expand(n, k, chunk))  # (N, k, chunk)
    values, pos = picked.view(n, k * chunk).topk(k, dim=1)  # (N, k) each
    # position in the picked chunks -> column of the row
    chunk_of = best_chunks.gather(1, torch.div(pos, chunk, rounding_mode="floor"))
    indices = chunk_of * chunk + pos.remainder(chunk)
    tail = v - n_chunks * chunk
    if tail:  # the last v % chunk entries are in no chunk: candidates of their own
        tail_cols = torch.arange(v - tail, v, device=scores.device).expand(n, tail)  # (N, tail)
        values, pos = torch.cat([values, scores.narrow(1, v - tail, tail)], 1).topk(k, dim=1)
        indices = torch.cat([indices, tail_cols], 1).gather(1, pos)
    return values, indices


def next_token_candidates(
    logits: Tensor, force_eos: Tensor | None, k: int
) -> tuple[Tensor, Tensor]:
    """logits (N, V) of the next token, force_eos (N,) bool or None -> (values (N, k) float32,
    tokens (N, k)): the k best of each row of ``next_token_log_probs(logits, force_eos)``,
    best first (as ``chunked_topk`` of them; a forced row's -inf candidates at other tokens).
    Where it pays (``kernels.log_softmax_topk_pays``: CUDA with Triton, CPUs with the native
    kernel), in one pass over the logits that never writes the (N, V) log-probabilities
    (kernels/topk_tiles.py), forced rows included.
    """
    choosable = logits.size(1) - (BOS - PAD + 1)
    if k <= choosable and kernels.log_softmax_topk_pays(logits.device, k):
        # PAD..BOS adjacent: excluded
        return kernels.log_softmax_topk(logits, k, PAD, BOS, force=force_eos, forced=EOS)
    return chunked_topk(next_token_log_probs(logits, force_eos), k)


def next_token_best(logits: Tensor, force_eos: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """logits (N, V) of the next token, force_eos (N,) bool or None -> (best (N,) float32,
    tokens (N,)): each row's largest ``next_token_log_probs(logits, force_eos)`` and its token
    (the first of ties); a forced row's token is EOS even where the model gives EOS -inf. Where
    it pays (``kernels.log_softmax_best_pays``: CPUs with the native kernel) without writing
    the (N, V) log-probabilities."""
    if kernels.log_softmax_best_pays(logits.device) and logits.size(1) > BOS - PAD + 1:
        values, tokens = kernels.log_softmax_topk(logits, 1, PAD, BOS, force=force_eos, forced=EOS)
        best, tok = values.squeeze(1), tokens.squeeze(1)  # (N, 1) -> (N,)
    else:
        lprobs = next_token_log_probs(logits, force_eos)
        tok = lprobs.argmax(dim=-1)
        best = lprobs.gather(1, tok[:, None]).squeeze(1)
    return best, (tok if force_eos is None else tok.masked_fill(force_eos, EOS))


__all__ = ["CHUNK", "chunked_topk", "next_token_best", "next_token_candidates", "topk_by_chunks"]
