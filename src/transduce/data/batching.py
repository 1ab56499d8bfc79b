"""Batches by token count (section 5.1): similar lengths together, shuffled, padded."""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import NamedTuple

import numpy as np
import torch
from torch import Tensor

from transduce.data.vocab import BOS, EOS, PAD

Pair = tuple[list[int], list[int]]  # (source ids, target ids), without BOS/EOS


class Batch(NamedTuple):
    src: Tensor  # (B, S) source ids + EOS, right-padded
    tgt_in: Tensor  # (B, T) BOS + target ids (decoder input, shifted right)
    tgt_out: Tensor  # (B, T) target ids + EOS (what the decoder must predict)
    n_tokens: int  # non-pad tokens in tgt_out

    def to(self, device: torch.device | str) -> Batch:
        return Batch(
            self.src.to(device, non_blocking=True),
            self.tgt_in.to(device, non_blocking=True),
            self.tgt_out.to(device, non_blocking=True),
            self.n_tokens,
        )

    def pin_memory(self) -> Batch:
        """In page-locked memory, so that ``to(cuda)`` copies while the host goes on."""
        return Batch(
            self.src.pin_memory(),
            self.tgt_in.pin_memory(),
            self.tgt_out.pin_memory(),
            self.n_tokens,
        )


def token_batch_arrays(
    lengths: Sequence[tuple[int, int]] | np.ndarray,
    max_tokens: int,
    *,
    seed: int,
    epoch: int,
    shuffle: bool = True,
    pad_multiple: int = 1,
) -> list[np.ndarray]:
    """Group example indices into batches of at most ``max_tokens`` padded tokens.

    ``lengths`` holds (source, target) lengths as the model sees them (with EOS / BOS): a
    sequence of pairs or an (N, 2) integer array (a prepared dataset's length index; no pair
    is read). A batch's cost is n_examples * max(longest source, longest target); examples are
    sorted by length (ties broken at random) so little is padding, and the batch order is
    shuffled. The result depends only on (seed, epoch), so a resumed run recomputes the same
    batches. An example longer than ``max_tokens`` gets a batch of its own. Each batch is an
    int64 array of indices (8 bytes per example: millions of pairs stay compact).
    ``pad_multiple``: lengths count as rounded up to a multiple of it, as ``collate`` pads them.
    """
    table = padded_lengths(np.asarray(lengths, dtype=np.int64).reshape(-1, 2), pad_multiple)
    rng = random.Random(seed * 1_000_003 + epoch)
    shuffled = list(range(len(table)))
    if shuffle:
        rng.shuffle(shuffled)  # random tie-breaking among equal lengths (the sort is stable)
    order = np.array(shuffled, dtype=np.int64)
    del shuffled
    src, tgt = table[order, 0], table[order, 1]
    by_length = np.lexsort((src, tgt))  # stable: by target length, then source length
    order, sizes = order[by_length], np.maximum(src, tgt)[by_length]
    bounds: list[int] = []
    count = longest = 0
    for k, size in enumerate(sizes.tolist()):
        if count and (count + 1) * max(longest, size) > max_tokens:
            bounds.append(k)
            count = longest = 0
        count += 1
        longest = max(longest, size)
    batches = np.split(order, bounds) if len(order) else []
    if shuffle:
        rng.shuffle(batches)
    return batches


def token_batches(
    lengths: Sequence[tuple[int, int]] | np.ndarray,
    max_tokens: int,
    *,
    seed: int,
    epoch: int,
    shuffle: bool = True,
    pad_multiple: int = 1,
) -> list[list[int]]:
    """``token_batch_arrays`` as lists of ints."""
    arrays = token_batch_arrays(
        lengths, max_tokens, seed=seed, epoch=epoch, shuffle=shuffle, pad_multiple=pad_multiple
    )
    return [b.tolist() for b in arrays]


def padded_lengths(lengths: np.ndarray, multiple: int) -> np.ndarray:
    """``lengths`` rounded up to a multiple of ``multiple`` (1: as they are). Padding batches to
    a few lengths bounds the distinct shapes a run meets: on a CPU each new shape costs the
    matrix library a kernel compile and memory (``transduce.runtime``), and BPE-dropout's new
    pieces each epoch bring new lengths."""
    return -(-lengths // multiple) * multiple


def collate(pairs: Sequence[Pair], pad_multiple: int = 1) -> Batch:
    """Pad a list of (source, target) id lists into a Batch (adds EOS, BOS); each side's length
    rounded up to a multiple of ``pad_multiple`` (``padded_lengths``)."""
    n = len(pairs)
    longest = np.array([max(len(s) for s, _ in pairs) + 1, max(len(t) for _, t in pairs) + 1])
    s_len, t_len = padded_lengths(longest, pad_multiple).tolist()
    src = torch.full((n, s_len), PAD, dtype=torch.long)
    tgt_in = torch.full((n, t_len), PAD, dtype=torch.long)
    tgt_out = torch.full((n, t_len), PAD, dtype=torch.long)
    for row, (s, t) in enumerate(pairs):
        src[row, : len(s) + 1] = torch.tensor([*s, EOS])
        tgt_in[row, : len(t) + 1] = torch.tensor([BOS, *t])
        tgt_out[row, : len(t) + 1] = torch.tensor([*t, EOS])
    n_tokens = sum(len(t) + 1 for _, t in pairs)
    return Batch(src, tgt_in, tgt_out, n_tokens)


def group_reader(
    pairs: Sequence[Pair],
    batches: Sequence[np.ndarray],
    update_freq: int,
    *,
    pin: bool,
    pad_multiple: int = 1,
) -> Callable[[int], list[Batch]]:
    """``read(first)``: the ``update_freq`` batches from ``batches[first]`` on (each an array of
    indices into ``pairs``), padded by ``collate`` (to ``pad_multiple``); in pinned memory if
    ``pin`` (for a CUDA device, so that the copy overlaps). For ``ReadAhead``
    (``data/read_ahead.py``)."""

    def read(first: int) -> list[Batch]:
        indices = batches[first : first + update_freq]
        group = [collate([pairs[i] for i in b.tolist()], pad_multiple) for b in indices]
        return [g.pin_memory() for g in group] if pin else group

    return read


def model_lengths(pairs: Sequence[Pair]) -> list[tuple[int, int]]:
    """(source + EOS, BOS + target) lengths, the sizes ``token_batches`` budgets."""
    return [(len(s) + 1, len(t) + 1) for s, t in pairs]


def length_index(pairs: Sequence[Pair]) -> np.ndarray:
    """The (N, 2) int32 array of ``model_lengths``: read from the pairs' own length index when
    they have one (``model_lengths()`` of a prepared dataset: no pair is read), else counted."""
    own = getattr(pairs, "model_lengths", None)
    if callable(own):
        return np.asarray(own(), dtype=np.int32).reshape(-1, 2)
    table = np.fromiter(
        (n for s, t in pairs for n in (len(s) + 1, len(t) + 1)),
        dtype=np.int32,
        count=2 * len(pairs),
    )
    return table.reshape(-1, 2)


def select_pairs(pairs: Sequence[Pair], kept: np.ndarray) -> Sequence[Pair]:
    """The pairs numbered ``kept`` (an int array), in that order: a view through the pairs'
    ``select`` when they have one (a prepared dataset: nothing is read), else a list."""
    own = getattr(pairs, "select", None)
    if callable(own):
        return own(kept)
    return [pairs[i] for i in kept.tolist()]
