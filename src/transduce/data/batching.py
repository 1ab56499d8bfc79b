"""Batches by token count (section 5.1): similar lengths together, shuffled, padded."""

from __future__ import annotations

import itertools
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
    rounded up to a multiple of ``pad_multiple`` (``padded_lengths``). A few numpy operations
    per batch rather than a few tensor operations per sentence: the Trainer reads batches on a
    thread beside the one that launches a GPU's kernels, and fed by it the update ran at half
    its rate on an H200, which pointed at that thread holding Python's lock; this way, at 0.88
    of its rate, and `transduce train` at 0.92 (benchmarks/RESULTS.md, benchmarks/
    train_gap.py)."""
    return collate_flat(_flat([s for s, _ in pairs]), _flat([t for _, t in pairs]), pad_multiple)


def collate_flat(
    src: tuple[np.ndarray, np.ndarray], tgt: tuple[np.ndarray, np.ndarray], pad_multiple: int = 1
) -> Batch:
    """``collate`` of B pairs given each side as (its ids end to end (total,) int64, each
    sentence's length (B,) int64)."""
    (src_ids, src_lens), (tgt_ids, tgt_lens) = src, tgt
    src_lens, tgt_lens = (np.asarray(x, dtype=np.int64) for x in (src_lens, tgt_lens))
    n = len(src_lens)
    longest = np.array([src_lens.max(initial=0) + 1, tgt_lens.max(initial=0) + 1])
    s_len, t_len = padded_lengths(longest, pad_multiple).tolist()
    src_pad = _padded(src_ids, src_lens, s_len, first=None, last=EOS)
    tgt_in = _padded(tgt_ids, tgt_lens, t_len, first=BOS, last=None)
    tgt_out = _padded(tgt_ids, tgt_lens, t_len, first=None, last=EOS)
    n_tokens = int(tgt_lens.sum()) + n
    src_t, tgt_in_t, tgt_out_t = (torch.from_numpy(x) for x in (src_pad, tgt_in, tgt_out))
    return Batch(src_t, tgt_in_t, tgt_out_t, n_tokens)


def _flat(seqs: Sequence[Sequence[int]]) -> tuple[np.ndarray, np.ndarray]:
    """The ids of ``seqs`` end to end (int64) and each one's length."""
    lens = np.fromiter((len(x) for x in seqs), dtype=np.int64, count=len(seqs))
    total = int(lens.sum())
    ids = np.fromiter(itertools.chain.from_iterable(seqs), dtype=np.int64, count=total)
    return ids, lens


def spans(begins: np.ndarray, lens: np.ndarray) -> np.ndarray:
    """begins (B,), lens (B,) int64 -> (sum(lens),) int64: begins[0], begins[0] + 1, ... (lens[0]
    of them), then lens[1] from begins[1], ...: the positions of B spans end to end, for one
    gather or scatter of many sequences."""
    within = np.arange(int(lens.sum())) - np.repeat(np.cumsum(lens) - lens, lens)  # 0.. per span
    return np.repeat(begins, lens) + within


def _padded(
    ids: np.ndarray, lens: np.ndarray, width: int, *, first: int | None, last: int | None
) -> np.ndarray:
    """(rows, ``width``) int64, row i: ``first`` (if any), sequence i's ids, ``last`` (if any),
    then PAD; ``ids`` the sequences end to end, ``lens`` their lengths."""
    rows = len(lens)
    out = np.full((rows, width), PAD, dtype=np.int64)
    shift = int(first is not None)
    out.reshape(-1)[spans(np.arange(rows) * width + shift, lens)] = ids  # row r from column shift
    if first is not None:
        out[:, 0] = first
    if last is not None:
        out[np.arange(rows), lens + shift] = last
    return out


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
    ``pin`` (for a CUDA device, so that the copy overlaps). Pairs with ``ids_of`` (``data.
    flat_pairs.FlatPairs``) are read a side at a time, with no Python step per pair. For
    ``ReadAhead`` (``data/read_ahead.py``)."""
    ids_of = getattr(pairs, "ids_of", None)

    def one(b: np.ndarray) -> Batch:
        if ids_of is not None:
            return collate_flat(ids_of(b, "src"), ids_of(b, "tgt"), pad_multiple)
        return collate([pairs[i] for i in b.tolist()], pad_multiple)

    def read(first: int) -> list[Batch]:
        group = [one(b) for b in batches[first : first + update_freq]]
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
