"""The Trainer's batch feed: the training pairs within max_len, each epoch's batches of this rank,
read one update ahead.

The batches of an epoch follow from the pairs' lengths, ``train.seed`` and the epoch alone
(``token_batch_arrays``), so a resumed run, or another rank, recomputes them instead of storing
them; each rank takes its own share (``distributed.shard``). Data drawn anew every epoch
(BPE-dropout: ``resegment``) is refused with several processes, whose draws would disagree;
on one process the epoch's draw goes into each checkpoint (``draw_state``), since a resumed
process would draw otherwise and cut the epoch's batches otherwise too: pairs seen twice and
others not at all (``restore_draw``).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from tqdm import tqdm

from transduce.config import TrainConfig
from transduce.data.batching import (
    Batch,
    Pair,
    group_reader,
    length_index,
    select_pairs,
    token_batch_arrays,
)
from transduce.data.flat_pairs import FlatPairs
from transduce.data.read_ahead import ReadAhead
from transduce.errors import UserError
from transduce.training import distributed
from transduce.training.loss_window import LossWindow
from transduce.training.progress import Progress

# The training pairs of an epoch (its number given), for data drawn anew every epoch (BPE-dropout)
Resegment = Callable[[int], Sequence[Pair]]


def _note(line: str) -> None:
    """A line on stderr, above a progress bar if one is shown (tqdm's own write)."""
    tqdm.write(line, file=sys.stderr)


# pad_multiple auto on a CUDA device, or with compile on: every new (batch, source, target) shape
# costs torch.compile a recompile (until it turns to dynamic shapes) and reduce-overhead a CUDA
# graph of its own, and 8 is the multiple tensor cores want of a bf16/fp16 matrix dimension
AUTO_PAD_MULTIPLE = 8

# On CUDA, whether the next batches are read as the current ones are handed out (True), or only
# once the update's gradient work is launched (False, EpochReader.read_ahead). On an H200 the
# command ran at ~360k target tokens/s against its update's 458k, which points at the reading
# thread and the launching thread taking turns at Python's lock (benchmarks/RESULTS.md); False
# is built for that but not measured there yet (`benchmarks/train_gap.py --diagnose` times
# both: reader_tokens_per_s, reader_launched_tokens_per_s): this stays True until it is
READ_EARLY_ON_CUDA = True


def pad_multiple_for(t: TrainConfig, device: torch.device) -> int:
    """The multiple that batch lengths are padded to: ``t.pad_multiple``, or for ``auto``
    ``AUTO_PAD_MULTIPLE`` on a CUDA device or with ``t.compile`` on, else 1 (a CPU's eager
    training as it was: its matrix library's kernel cache absorbs new shapes, and padding is
    work)."""
    if t.pad_multiple != "auto":
        return t.pad_multiple
    return AUTO_PAD_MULTIPLE if device.type == "cuda" or t.compile else 1


class EpochReader:
    """One epoch's ``batches`` of this rank (index arrays into the pairs), an update's worth
    (``update_freq`` batches, ``read(first)``) at a time, the next one read on a background
    thread while the current one trains (``ReadAhead``).

    ``early``: the next read starts as ``next`` hands out the current group; else only at
    ``read_ahead``, which the Trainer calls once an update's gradient work is launched, just
    before the host waits for the device (``Trainer.reading``), so that the read's Python work
    does not take turns at Python's lock with the launching of the forward and backward
    (``READ_EARLY_ON_CUDA``); ``next`` reads what was not started."""

    def __init__(
        self,
        batches: list[np.ndarray],
        read: Callable[[int], list[Batch]],
        update_freq: int,
        early: bool = True,
    ) -> None:
        self.batches, self.read, self.update_freq = batches, read, update_freq
        self.early = early
        self._reader = ReadAhead(read)
        self._ahead: int | None = None  # the next group's first batch, not yet being read

    def ended(self, p: Progress) -> bool:
        """Whether ``p`` stands past the epoch's last batch."""
        return p.batch_index >= len(self.batches)

    def next(self, p: Progress, window: LossWindow) -> list[Batch] | None:
        """The batches of the update at ``p.batch_index``, which moves past them (None: the
        epoch has ended); the time spent waiting for them goes to ``window``."""
        if self.ended(p):
            return None
        first = p.batch_index
        p.batch_index = min(first + self.update_freq, len(self.batches))
        waiting = time.monotonic()
        ahead = None if self.ended(p) else p.batch_index
        group = self._reader.get(first, ahead if self.early else None)
        window.waited(time.monotonic() - waiting)
        self._ahead = None if self.early else ahead
        return group

    def read_ahead(self) -> None:
        """Start reading the next group, if ``next`` left it (``early`` False) and it is not
        being read yet."""
        if self._ahead is not None:
            self._reader.start(self._ahead)
            self._ahead = None

    def __enter__(self) -> EpochReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self._ahead = None  # read_ahead is a no-op once closed
        self._reader.close()


class BatchFeed:
    """The training pairs within ``max_len`` and, epoch by epoch, this rank's batches of them.

    ``resegment``, when given, supplies each epoch's pairs in place of ``pairs`` (which still
    decide ``n_filtered``); it must return the same pairs for the same epoch, so that batches
    can be recomputed after a resume. ``note``: how rank 0 says, once, that batches were left
    out for equal shares (``distributed.shard``); default a line on stderr.
    """

    def __init__(
        self,
        pairs: Sequence[Pair],
        t: TrainConfig,
        world: distributed.World,
        resegment: Resegment | None = None,
        note: Callable[[str], None] = _note,
    ) -> None:
        if resegment is not None and world.distributed:
            # SentencePiece's sampling differs between processes even with one seed, so ranks
            # would cut different batches: data seen twice or not at all, and a hang
            raise UserError(
                f"bpe_dropout with {world.size} processes: SentencePiece's BPE-dropout "
                "draws differently in each process, so the ranks' batches would disagree; "
                "train on one process or set bpe_dropout to 0"
            )
        self.t, self.world, self.resegment, self.note = t, world, resegment, note
        self.left_out_told = False  # whether the batches left out were spoken of (once a run)
        # with resegment: the epoch whose pairs were drawn last and those pairs (draw_state);
        # a checkpoint's draw to take in place of drawing its epoch again (restore_draw)
        self.drawn: tuple[int, FlatPairs] | None = None
        self._restored: tuple[int, FlatPairs] | None = None
        self._use(pairs)
        self.n_filtered = len(pairs) - len(self.pairs)

    def _use(self, pairs: Sequence[Pair]) -> None:
        """Train on ``pairs`` from now on, less those longer than max_len: chosen by their
        length index (a prepared dataset's is read from disk, no pair is), the kept ones a
        view (``select_pairs``). Pairs in lists are stored flat first (``FlatPairs``: a batch
        read with no Python step per pair)."""
        max_len = self.t.max_len
        if not callable(getattr(pairs, "select", None)):  # lists: stored flat, read by indexing
            pairs = FlatPairs(pairs)
        lengths = length_index(pairs)  # (N, 2): source + EOS, BOS + target
        kept = np.flatnonzero(lengths.max(axis=1, initial=0) <= max_len)
        if not len(kept):
            raise UserError(
                f"every training pair is longer than max_len={max_len} tokens "
                f"(all {len(pairs)}, with EOS); raise max_len"
            )
        self.pairs = select_pairs(pairs, kept)
        self.lengths = lengths[kept]

    def epoch(self, epoch: int, device: torch.device, early: bool | None = None) -> EpochReader:
        """This rank's batches of ``epoch``, read in pinned memory for a CUDA ``device`` (the
        copy overlaps); called once as each epoch starts (or resumes), which is when
        ``resegment`` draws that epoch's pairs. ``early`` (``EpochReader``): None = True, on
        CUDA ``READ_EARLY_ON_CUDA``."""
        t, multiple = self.t, pad_multiple_for(self.t, device)
        if self.resegment is not None:
            self._use(self._draw(epoch))
        every = token_batch_arrays(
            self.lengths, t.max_tokens, seed=t.seed, epoch=epoch, pad_multiple=multiple
        )
        if len(every) < self.world.size:  # every rank's share empty: epochs without an update
            raise UserError(
                f"epoch {epoch} has {len(every)} batch{'es' * (len(every) != 1)} of "
                f"max_tokens={t.max_tokens} for {self.world.size} processes, so no process "
                "would get one; lower max_tokens or train on fewer processes"
            )
        self._tell_left_out(epoch, every)
        batches = distributed.shard(every, self.world)
        read = group_reader(
            self.pairs,
            batches,
            t.update_freq,
            pin=device.type == "cuda",
            pad_multiple=multiple,
        )
        if early is None:
            early = READ_EARLY_ON_CUDA if device.type == "cuda" else True
        return EpochReader(batches, read, t.update_freq, early)

    def _tell_left_out(self, epoch: int, every: list[np.ndarray]) -> None:
        """On rank 0, the first time ``shard`` leaves batches of ``every`` out: how many."""
        left = len(every) % self.world.size
        if not left or self.left_out_told or not self.world.is_main:
            return
        self.left_out_told = True
        pairs = sum(len(b) for b in every[len(every) - left :])
        self.note(
            f"epoch {epoch}: {left} batch{'es' * (left != 1)} ({pairs} pairs) of {len(every)} "
            f"left out so that {self.world.size} processes take equal shares; each epoch's "
            "shuffle leaves out others"
        )

    def _draw(self, epoch: int) -> FlatPairs:
        """``epoch``'s pairs from ``resegment``, or from the checkpoint's draw of it."""
        assert self.resegment is not None
        restored, self._restored = self._restored, None
        if restored is not None and restored[0] == epoch:
            drawn = restored[1]
        else:
            pairs = self.resegment(epoch)
            drawn = pairs if isinstance(pairs, FlatPairs) else FlatPairs(pairs)
        self.drawn = (epoch, drawn)
        return drawn

    def draw_state(self) -> dict[str, Any] | None:
        """What a checkpoint keeps of the pairs drawn for the current epoch (``resegment``):
        the epoch and the pairs' arrays as tensors; None without ``resegment`` or before the
        first epoch."""
        if self.drawn is None:
            return None
        epoch, pairs = self.drawn
        arrays = {k: torch.from_numpy(v) for k, v in pairs.arrays().items()}
        return {"epoch": epoch, **arrays}

    def restore_draw(self, state: dict[str, Any]) -> None:
        """Take ``draw_state``'s pairs for its epoch instead of drawing them again, so that a
        run resumed within that epoch cuts the batches it was cut into; a ValueError where
        ``state`` is not such a draw."""
        if self.resegment is None:
            raise ValueError("a draw of the training pairs, but this run draws none")
        epoch = state.get("epoch")
        if not isinstance(epoch, int) or epoch < 0:
            raise ValueError(f"the draw's epoch must be a non-negative int, not {epoch!r}")
        arrays = {
            k: v.numpy() if isinstance(v, torch.Tensor) else v
            for k, v in state.items()
            if k != "epoch"
        }
        self._restored = (epoch, FlatPairs.from_arrays(arrays))


__all__ = [
    "AUTO_PAD_MULTIPLE",
    "READ_EARLY_ON_CUDA",
    "BatchFeed",
    "EpochReader",
    "Resegment",
    "pad_multiple_for",
]
