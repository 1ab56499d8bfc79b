"""Batches by token count (section 5.1): similar lengths together, shuffled, padded."""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import NamedTuple

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


def token_batches(
    lengths: Sequence[tuple[int, int]],
    max_tokens: int,
    *,
    seed: int,
    epoch: int,
    shuffle: bool = True,
) -> list[list[int]]:
    """Group example indices into batches of at most ``max_tokens`` padded tokens.

    ``lengths`` holds (source, target) lengths as the model sees them (with EOS / BOS). A batch's
    cost is n_examples * max(longest source, longest target); examples are sorted by length (ties
    broken at random) so little is padding, and the batch order is shuffled. The result depends
    only on (seed, epoch), so a resumed run recomputes the same batches. An example longer than
    ``max_tokens`` gets a batch of its own.
    """
    rng = random.Random(seed * 1_000_003 + epoch)
    order = list(range(len(lengths)))
    if shuffle:
        rng.shuffle(order)  # random tie-breaking among equal lengths (sort is stable)
    order.sort(key=lambda i: (lengths[i][1], lengths[i][0]))
    batches: list[list[int]] = []
    current: list[int] = []
    longest = 0
    for i in order:
        size = max(lengths[i])
        if current and (len(current) + 1) * max(longest, size) > max_tokens:
            batches.append(current)
            current, longest = [], 0
        current.append(i)
        longest = max(longest, size)
    if current:
        batches.append(current)
    if shuffle:
        rng.shuffle(batches)
    return batches


def collate(pairs: Sequence[Pair]) -> Batch:
    """Pad a list of (source, target) id lists into a Batch (adds EOS, BOS)."""
    n = len(pairs)
    s_len = max(len(s) for s, _ in pairs) + 1
    t_len = max(len(t) for _, t in pairs) + 1
    src = torch.full((n, s_len), PAD, dtype=torch.long)
    tgt_in = torch.full((n, t_len), PAD, dtype=torch.long)
    tgt_out = torch.full((n, t_len), PAD, dtype=torch.long)
    for row, (s, t) in enumerate(pairs):
        src[row, : len(s) + 1] = torch.tensor([*s, EOS])
        tgt_in[row, : len(t) + 1] = torch.tensor([BOS, *t])
        tgt_out[row, : len(t) + 1] = torch.tensor([*t, EOS])
    n_tokens = sum(len(t) + 1 for _, t in pairs)
    return Batch(src, tgt_in, tgt_out, n_tokens)


def model_lengths(pairs: Sequence[Pair]) -> list[tuple[int, int]]:
    """(source + EOS, BOS + target) lengths, the sizes ``token_batches`` budgets."""
    return [(len(s) + 1, len(t) + 1) for s, t in pairs]
